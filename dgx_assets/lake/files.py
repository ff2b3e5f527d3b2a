"""The lake's file systems: URIs that Spark (through Hadoop) and pyarrow both accept, and listings that
skip what is hidden or still being written."""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

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
