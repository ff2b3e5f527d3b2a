"""The lake's file systems: URIs that Spark (through Hadoop) and pyarrow both accept, and listings that
skip what is hidden or still being written."""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pyarrow.fs as pafs

PARTITION_COLUMN = "batch"  # the tables' partition column (the landing batch)


# --- batch names: data, never path or URI syntax -------------------------------------------------------
#
# A batch name goes into a folder name as Spark/Hive and Iceberg write partition values: every byte that is
# not an ASCII letter, digit or one of `-_.~` becomes %XX of its UTF-8 (so `%`, `#`, `?`, `/`, `\`, `:`, `=`,
# space, control characters, glob characters and non-ASCII letters are escaped). The folder name is then a
# plain path segment: no filesystem, URI parser or Hadoop glob reads anything into it.


def batch_name(name: str) -> str:
    """The batch a landing folder name stands for: its NFC form, so `café` typed or copied in NFD is one batch."""
    return unicodedata.normalize("NFC", name)


def partition_segment(value: str) -> str:
    """`lot 7#2` -> `lot%207%232`: a partition value as one path segment (the inverse is `partition_value`)."""
    return quote(value, safe="", encoding="utf-8", errors="strict")


def partition_value(segment: str) -> str:
    """`lot%207%232` -> `lot 7#2`: the partition value a path segment of `partition_segment` holds."""
    return unquote(segment, encoding="utf-8", errors="strict")


def partition_folder(value: str) -> str:
    """`batch=<escaped value>`: the folder of one partition of a table."""
    return f"{PARTITION_COLUMN}={partition_segment(value)}"


# --- URIs and locations -------------------------------------------------------------------------------
#
# The lake speaks RFC 3986 URIs (`file:///my%20lake`, as Path.as_uri() writes them); pyarrow decodes them.
# Iceberg (pyiceberg, Iceberg's Java library) and Hadoop (Spark's paths) take *locations*: the scheme and
# authority, then the path as it is, unescaped (`file:///my lake`). `path_of` is the one place that unquotes.


def child_uri(parent_uri: str, name: str) -> str:
    """The URI of the entry `name` (a literal file or folder name, say a landing batch) inside `parent_uri`."""
    return f"{normalize_uri(parent_uri).rstrip('/')}/{quote(name, safe='=')}"  # `batch=b1` reads as it is


def to_location(uri: str) -> str:
    """`file:///my%20lake/t` -> `file:///my lake/t`: a lake URI as Iceberg and Hadoop name it."""
    parsed = urlparse(normalize_uri(uri))
    path = path_of(uri)
    if "#" in path or "?" in path:  # pyiceberg parses locations with urlparse: these would end its path
        raise ValueError(f"{path!r} holds '#' or '?', which an Iceberg location cannot carry: move the lake")
    return f"{parsed.scheme}://{parsed.netloc}{path}"


def location_path(location: str) -> str:
    """`file:/a b`, `file:///a b` or `hdfs://nn:8020/a b` -> `/a b`: the path of a location, taken as it is."""
    scheme, colon, rest = location.partition(":")
    if not colon or "/" in scheme:  # a plain path
        return location
    return "/" + rest[2:].partition("/")[2] if rest.startswith("//") else rest


def from_location(location: str) -> str:
    """`file:///my lake/t` -> `file:///my%20lake/t`: an Iceberg or Hadoop location as a lake URI."""
    scheme, colon, rest = location.partition(":")
    if not colon or "/" in scheme:
        return normalize_uri(location)
    netloc = rest[2:].partition("/")[0] if rest.startswith("//") else ""
    return f"{scheme}://{netloc}{quote(location_path(location), safe='/')}"


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
        return PyFileSystem(FSSpecHandler(fs)), path_of(uri)
    if scheme in ("hdfs", "viewfs"):
        # Made as pyiceberg's file IO makes it, so the tables and the lake open HDFS with the same client settings.
        return pafs.HadoopFileSystem.from_uri(f"{scheme}://{urlparse(uri).netloc}"), path_of(uri)
    if scheme == "file":
        return pafs.LocalFileSystem(), path_of(uri)
    return pafs.FileSystem.from_uri(uri)


def path_of(uri: str) -> str:
    """The path of `uri` inside its filesystem, without connecting to it (`filesystem_for` connects): the one
    place a lake URI is unquoted (`file:///my%20lake` -> `/my lake`)."""
    return unquote(urlparse(normalize_uri(uri)).path, errors="strict") or "/"


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
