"""The lake: where assets write, on a local disk, on HDFS or over WebHDFS, and its tables' catalog.

One `Lake` speaks URIs that both Spark (through Hadoop's filesystems) and pyarrow accept. Its tables are
Apache Iceberg tables (`Lake.tables`, dgx_assets/catalog.py): partitions are committed as Iceberg
transactions, and readers take the files of a snapshot, never a folder listing.

What is not a table (trained_model's and edge_model's folders, the search's recipe) stays a folder of files,
written into a hidden sibling and swapped in by two renames (`commit`): a reader never sees half of it, and a
run killed between the renames leaves the previous version aside, which the next swap puts back.
`dgx-assets lake maintain` deletes the hidden siblings that killed runs left, once older than a few days.
"""

from __future__ import annotations

import functools
import posixpath
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from dgx_assets.catalog import LakeTables

PARTITION_COLUMN = "batch"  # the tables' partition column (the landing batch)


def normalize_uri(location: str) -> str:
    """A plain path becomes an absolute `file://` URI; URIs are kept, without a trailing slash."""
    if "://" not in location:
        return Path(location).expanduser().resolve().as_uri()
    return location.rstrip("/") if not location.endswith(":///") else location


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem serving `uri`, and the path of `uri` inside it."""
    uri = normalize_uri(uri)
    scheme = urlparse(uri).scheme
    if scheme in ("webhdfs", "swebhdfs"):
        # pyarrow has no WebHDFS client of its own; fsspec's speaks the REST API.
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        fs = fsspec.filesystem(scheme, **_authority_options(uri))
        return PyFileSystem(FSSpecHandler(fs)), urlparse(uri).path or "/"
    if scheme in ("hdfs", "viewfs"):
        # Made as pyiceberg's file IO makes it, so the tables and the lake open HDFS with the same client settings.
        parsed = urlparse(uri)
        return pafs.HadoopFileSystem.from_uri(f"{scheme}://{parsed.netloc}"), parsed.path or "/"
    return pafs.FileSystem.from_uri(uri)


def path_of(uri: str) -> str:
    """The path of `uri` inside its filesystem, without connecting to it (`filesystem_for` connects)."""
    return urlparse(normalize_uri(uri)).path or "/"


def _authority_options(uri: str) -> dict:
    parsed = urlparse(uri)
    options: dict = {"host": parsed.hostname}
    if parsed.port:
        options["port"] = parsed.port
    if parsed.username:
        options["user"] = parsed.username
    return options


def worker_filesystem(uri: str) -> pafs.FileSystem:
    """The filesystem serving `uri`, one client per process and authority: Spark reuses Python workers
    across tasks, and an HDFS connection is worth keeping."""
    parsed = urlparse(normalize_uri(uri))
    return _filesystem_at(f"{parsed.scheme}://{parsed.netloc}/")


@functools.cache
def _filesystem_at(authority: str) -> pafs.FileSystem:
    return filesystem_for(authority)[0]


def visible_file_infos(fs: pafs.FileSystem, path: str, recursive: bool = True) -> list[pafs.FileInfo]:
    """Files under folder `path`, hidden and `_`-prefixed parts skipped (as Spark skips them), sorted by
    path; none when the folder does not exist."""
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    infos = [
        info
        for info in fs.get_file_info(pafs.FileSelector(path, recursive=recursive))
        if info.type == pafs.FileType.File and not has_hidden_part(info.path[len(path) :].lstrip("/"))
    ]
    return sorted(infos, key=lambda info: info.path)


def visible_files(fs: pafs.FileSystem, path: str, suffix: str = "", recursive: bool = True) -> list[str]:
    """The paths of `visible_file_infos` whose names end in `suffix`."""
    return [info.path for info in visible_file_infos(fs, path, recursive) if info.path.endswith(suffix)]


def has_hidden_part(relative: str) -> bool:
    """Whether any part of a relative path is hidden (`.x`) or a marker or temporary folder (`_x`): Spark
    skips those, and so do the lake's listings, the landing sensor and ingest."""
    return relative.startswith((".", "_")) or "/." in relative or "/_" in relative


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
            from dgx_assets.catalog import LakeTables

            self._tables = LakeTables(
                self, self.catalog_uri or settings.catalog_uri(self.root), self.warehouse or settings.catalog_warehouse(self.root)
            )
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
        return self.uri(asset, f"{PARTITION_COLUMN}={partition}")

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
    def commit(self, staging_uri: str, final_uri: str) -> None:
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
            if name.startswith(".staging-") and info.type == pafs.FileType.Directory and old:
                self.fs.delete_dir(info.path)
                swept.append(self.uri_of(info.path))
        return swept
