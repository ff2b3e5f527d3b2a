"""Looking at the landing zone: which batch folders exist, and whether each is still being written.

A batch is fingerprinted from the names, sizes and modification times of its files, so the sensor's
cursor holds one short hash per batch however many files land. A batch is ready when it holds no file
still being copied and its fingerprint is the same on two looks in a row.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass

import pyarrow.fs as pafs

from dgx_assets.lake import filesystem_for

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
    per_batch: dict[str, list[pafs.FileInfo]] = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        relative = info.path[len(root):].lstrip("/")
        parts = relative.split("/")
        if len(parts) == 1:
            if info.type == pafs.FileType.Directory and not is_ignored(parts[0]):
                per_batch.setdefault(parts[0], [])
            continue
        if info.type != pafs.FileType.File or is_ignored(parts[0]):
            continue
        per_batch.setdefault(parts[0], []).append(info)
    return {name: _state(name, root, infos) for name, infos in sorted(per_batch.items())}


def _state(name: str, root: str, infos: list[pafs.FileInfo]) -> BatchState:
    digest = hashlib.sha256()
    in_progress, files, total = [], 0, 0
    for info in sorted(infos, key=lambda i: i.path):
        base = posixpath.basename(info.path)
        if base.endswith(IN_PROGRESS_SUFFIXES):
            in_progress.append(info.path[len(root):].lstrip("/"))
        if any(is_ignored(part) for part in info.path[len(root):].lstrip("/").split("/")[1:]):
            continue
        files += 1
        total += info.size or 0
        mtime = info.mtime_ns or 0
        digest.update(f"{info.path}\0{info.size}\0{mtime}\n".encode())
    return BatchState(name, files, total, digest.hexdigest()[:16], tuple(in_progress))
