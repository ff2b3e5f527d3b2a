"""Looking at the landing zone: which batch folders exist, and whether each is still being written.

A batch is fingerprinted from the names, sizes and modification times of its visible files, so the
sensor's cursor holds one short hash per batch however many files land. A batch is ready when it holds no
file still being copied and its fingerprint is the same on two looks in a row. Hidden and `_`-prefixed
files and folders are not looked at (Spark and ingest skip them too).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
from dataclasses import dataclass

import pyarrow.fs as pafs

from dgx_assets.lake import filesystem_for, has_hidden_part

# HDFS `put` writes `<name>._COPYING_` and renames at the end; other tools leave these while writing.
IN_PROGRESS_SUFFIXES = ("._COPYING_", ".tmp", ".part", ".crdownload")


@dataclass(frozen=True)
class BatchState:
    name: str
    files: int
    total_bytes: int
    fingerprint: str
    in_progress: tuple[str, ...]  # files still being written

    @property
    def complete(self) -> bool:
        return not self.in_progress and self.files > 0


def is_ignored(name: str) -> bool:
    """Hidden files and `_SUCCESS`-style markers are never ingested."""
    return name.startswith((".", "_"))


def scan_landing(landing_uri: str) -> dict[str, BatchState]:
    """Every batch folder under the landing zone, in one recursive listing."""
    fs, root = filesystem_for(landing_uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return {}
    # Local landing zones (a laptop, an NFS mount) are walked with os.scandir, whose directory entries
    # carry the file type for free: pyarrow's listing and its FileInfo objects cost twice the walk on
    # 100,000 files (bench/code_location.py). HDFS and WebHDFS are listed through pyarrow, where the
    # namenode round trips dominate.
    walk = _walk_local if isinstance(fs, pafs.LocalFileSystem) else functools.partial(_list_remote, fs)
    return {name: _state(name, root, files) for name, files in sorted(walk(root).items())}


# A listing: per batch folder, every visible file below it as (path, size, mtime_ns).
Listing = dict[str, list[tuple[str, int, int]]]


def _walk_local(root: str) -> Listing:
    listing: Listing = {}
    with os.scandir(root) as top:
        batches = [entry for entry in top if not is_ignored(entry.name) and entry.is_dir()]
    for batch in batches:
        files = listing[batch.name] = []
        folders = [batch.path]
        while folders:
            try:
                entries = os.scandir(folders.pop())
            except FileNotFoundError:  # removed since its parent was read
                continue
            with entries:
                for entry in entries:
                    if is_ignored(entry.name):
                        continue
                    if entry.is_dir():
                        folders.append(entry.path)
                        continue
                    try:
                        stat = entry.stat()
                    except FileNotFoundError:
                        # A broken link, or renamed since the folder was read (a copy tool finishing): the
                        # next look sees the result, and the changed fingerprint holds the batch back.
                        continue
                    files.append((entry.path, stat.st_size, stat.st_mtime_ns))
    return listing


def _list_remote(fs: pafs.FileSystem, root: str) -> Listing:
    listing: Listing = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        # Each FileInfo property builds a new Python object: read each once.
        path, kind = info.path, info.type
        batch, _, inside = path[len(root):].lstrip("/").partition("/")
        if is_ignored(batch):
            continue
        if not inside:
            if kind == pafs.FileType.Directory:
                listing.setdefault(batch, [])
        elif kind == pafs.FileType.File and not has_hidden_part(inside):
            listing.setdefault(batch, []).append((path, info.size or 0, info.mtime_ns or 0))
    return listing


def _state(name: str, root: str, files: list[tuple[str, int, int]]) -> BatchState:
    """Counts and a fingerprint of one batch from its visible files' (path, size, mtime_ns).

    The fingerprint is what the sensor's cursor holds: its formula must not change, or every batch runs again.
    """
    # One line per file; sorting the lines sorts by path ("\0" ends each path and sorts first), and is
    # cheaper than sorting the tuples.
    lines = sorted([f"{path}\0{size}\0{mtime}\n" for path, size, mtime in files])
    text = "".join(lines)
    in_progress: tuple[str, ...] = ()
    if any(f"{suffix}\0" in text for suffix in IN_PROGRESS_SUFFIXES):  # one scan of the text; rarely true
        copying = sorted(path for path, _, _ in files if path.endswith(IN_PROGRESS_SUFFIXES))
        in_progress = tuple(path[len(root):].lstrip("/") for path in copying)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return BatchState(name, len(files), sum(map(operator.itemgetter(1), files)), digest, in_progress)
