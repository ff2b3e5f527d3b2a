"""The lake: where assets write, on a local disk, on HDFS or over WebHDFS, and its tables' catalog.

One `Lake` speaks URIs that both Spark (through Hadoop's filesystems) and pyarrow accept. Its tables are
Apache Iceberg tables (`Lake.tables`, dgx_assets/lake/tables.py): partitions are committed as Iceberg
transactions, and readers take the files of a snapshot, never a folder listing.

What is not a table (trained_model's and edge_model's folders, the search's recipe) stays a folder of files,
written into a hidden sibling (`staging_uri`, the one staging-name convention) and swapped in by two renames
(`swap_in`): a reader never sees half of it, and a run killed between the renames leaves the previous version
aside, which the next swap puts back.
`dgx-assets lake maintain` deletes the hidden siblings that killed runs left, once older than a few days.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from dgx_assets.lake.tables import LakeTables

from dgx_assets.lake.files import child_uri, filesystem_for, normalize_uri, partition_folder

STAGING_PREFIX = ".staging-"  # a dot-name: the docs server never serves it; `lake maintain` sweeps the ones killed runs left


@dataclass
class Lake:
    root: str
    catalog_uri: str | None = None  # None: DGX_CATALOG_URI, else a sqlite file beside a local lake
    warehouse: str | None = None  # None: DGX_CATALOG_WAREHOUSE, else <root>/warehouse
    fs: pafs.FileSystem = field(init=False, repr=False)
    _root_path: str = field(init=False, repr=False)
    _tables: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = normalize_uri(self.root)
        self.fs, self._root_path = filesystem_for(self.root)

    @property
    def tables(self) -> LakeTables:
        """The lake's Iceberg tables (pyiceberg is imported here, by runs only)."""
        if self._tables is None:
            from dgx_assets import settings
            from dgx_assets.lake.tables import LakeTables

            env = settings.environment().with_lake(self.root)  # the defaults beside this lake, not DGX_LAKE_ROOT's
            self._tables = LakeTables(self, self.catalog_uri or env.catalog_uri, self.warehouse or env.catalog_warehouse)
        return self._tables

    # --- naming -------------------------------------------------------------------------------
    def uri(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def fs_path(self, uri: str) -> str:
        """The path of a URI under this lake's root, as this lake's pyarrow filesystem names it."""
        uri = normalize_uri(uri)
        if not uri.startswith(self.root):
            return filesystem_for(uri)[1]
        relative = uri[len(self.root) :].lstrip("/")
        return posixpath.join(self._root_path, relative) if relative else self._root_path

    def uri_of(self, path: str) -> str:
        """The URI of a path of this lake's filesystem, under its root (the inverse of `fs_path`)."""
        if path != self._root_path and not path.startswith(self._root_path.rstrip("/") + "/"):
            raise ValueError(f"{path} is not under the lake's root {self.root}")
        relative = path[len(self._root_path) :].lstrip("/")
        return self.uri(relative) if relative else self.root

    def asset_uri(self, asset: str, partition: str | None = None) -> str:
        if partition is None:
            return self.uri(asset)
        return child_uri(self.uri(asset), partition_folder(partition))  # the batch escaped: a segment, never URI syntax

    # --- files ----------------------------------------------------------------------------------
    def exists(self, uri: str) -> bool:
        return self.fs.get_file_info(self.fs_path(uri)).type != pafs.FileType.NotFound

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = self.fs_path(uri)
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def read_bytes(self, uri: str) -> bytes:
        with self.fs.open_input_stream(self.fs_path(uri)) as stream:
            return stream.read()

    def delete(self, uri: str) -> None:
        path = self.fs_path(uri)
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(path)

    # --- atomic replace ---------------------------------------------------------------------------
    def staging_uri(self, asset: str) -> str:
        """A fresh hidden folder at the lake's top to write `asset`'s next version into before `swap_in`."""
        return self.uri(f"{STAGING_PREFIX}{asset}-{uuid.uuid4().hex[:12]}")

    def swap_in(self, staging_uri: str, final_uri: str) -> None:
        """Make the folder `staging_uri` (a hidden sibling of `final_uri`) visible as `final_uri`, replacing what
        was there: for the outputs that are not tables."""
        staging, final = self.fs_path(staging_uri), self.fs_path(final_uri)
        parent = posixpath.dirname(final)
        self._tidy(parent)
        previous = posixpath.join(parent, f".{posixpath.basename(final)}.previous-{uuid.uuid4().hex[:12]}")
        replaced = self.fs.get_file_info(final).type != pafs.FileType.NotFound
        if replaced:
            self.fs.move(final, previous)
        self.fs.move(staging, final)
        if replaced:
            self.fs.delete_dir(previous)

    def _tidy(self, parent: str) -> None:
        """Put back a previous version that a killed swap left aside, or drop it when the new one is in."""
        if self.fs.get_file_info(parent).type != pafs.FileType.Directory:
            return
        for info in self.fs.get_file_info(pafs.FileSelector(parent)):
            name = posixpath.basename(info.path)
            if not (name.startswith(".") and ".previous-" in name):
                continue
            final = posixpath.join(parent, name[1:].split(".previous-")[0])
            if self.fs.get_file_info(final).type == pafs.FileType.NotFound:
                self.fs.move(info.path, final)
            else:
                self.fs.delete_dir(info.path)

    def sweep_staging(self, older_than_s: float) -> list[str]:
        """Delete the hidden `.staging-*` folders at the lake's top that killed runs left, once older than
        `older_than_s` (a live run's is younger: it swaps its folder in within the run)."""
        swept = []
        for info in self.fs.get_file_info(pafs.FileSelector(self._root_path, allow_not_found=True)):
            name = posixpath.basename(info.path)
            old = info.mtime_ns is not None and time.time() - info.mtime_ns / 1e9 > older_than_s
            if name.startswith(STAGING_PREFIX) and info.type == pafs.FileType.Directory and old:
                self.fs.delete_dir(info.path)
                swept.append(self.uri_of(info.path))
        return swept
