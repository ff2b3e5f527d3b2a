"""Listing and deleting in the lake without following links: what `lake maintain` and `lake migrate` stand on.

A local lake is read with lstat and scandir (a link is reported as one and never descended into or deleted
through); HDFS, where links are off by default, through pyarrow's listing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from dgx_assets.lake.files import filesystem_for


@dataclass(frozen=True)
class Entry:
    uri: str
    kind: str  # "file", "dir", "link" (never followed) or "other"
    mtime_ns: int | None


def _is_local(uri: str) -> bool:
    return urlparse(uri).scheme == "file"


def _local_path(uri: str) -> str:
    return filesystem_for(uri)[1]


def lstat_entry(uri: str) -> Entry | None:
    """The entry at `uri` itself (a link is a link), or None when nothing is there."""
    if _is_local(uri):
        try:
            info = os.lstat(_local_path(uri))
        except FileNotFoundError:
            return None
        kind = (
            "link"
            if stat.S_ISLNK(info.st_mode)
            else "dir"
            if stat.S_ISDIR(info.st_mode)
            else "file"
            if stat.S_ISREG(info.st_mode)
            else "other"
        )
        return Entry(uri, kind, info.st_mtime_ns)
    fs, path = filesystem_for(uri)
    found = fs.get_file_info(path)
    if found.type == pafs.FileType.NotFound:
        return None
    kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}.get(found.type, "other")
    return Entry(uri, kind, found.mtime_ns)


def entries(uri: str, recursive: bool = False) -> Iterator[Entry]:
    """What is inside the folder `uri`, sorted, never through a link: a link is yielded as one and not
    descended into (on HDFS, where links are off by default, pyarrow's listing)."""
    if _is_local(uri):
        try:
            with os.scandir(_local_path(uri)) as found:
                names = sorted(entry.name for entry in found)
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in names:
            entry = lstat_entry(f"{uri}/{name}")
            if entry is None:
                continue
            yield entry
            if recursive and entry.kind == "dir":
                yield from entries(entry.uri, recursive=True)
        return
    fs, root = filesystem_for(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=recursive, allow_not_found=True))
    for info in sorted(infos, key=lambda info: info.path):
        kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}.get(info.type, "other")
        yield Entry(f"{uri}/{info.path[len(root) :].lstrip('/')}", kind, info.mtime_ns)


def delete_entry(entry: Entry) -> None:
    """Delete a file or a folder (its links are removed, never followed)."""
    if _is_local(entry.uri):
        path = _local_path(entry.uri)
        if entry.kind == "dir":
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return
    fs, path = filesystem_for(entry.uri)
    (fs.delete_dir if entry.kind == "dir" else fs.delete_file)(path)


def read_json(uri: str) -> dict | None:
    fs, path = filesystem_for(uri)
    try:
        with fs.open_input_stream(path) as stream:
            found = json.loads(stream.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
