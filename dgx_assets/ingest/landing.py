"""Looking at the landing zone: which batch folders exist, and whether each is still being written.

A batch is fingerprinted from the names, sizes and modification times of its files, so the sensor's
cursor holds one short hash per batch however many files land. A batch is ready when it holds no file
still being copied and its fingerprint is the same on two looks in a row.
"""

from __future__ import annotations

import hashlib
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
    per_batch: dict[str, list[tuple[str, str, int, int]]] = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        # Each FileInfo property builds a new Python object: read each once (100,000 files per tick).
        path, kind = info.path, info.type
        batch, _, inside = path[len(root):].lstrip("/").partition("/")
        if not inside:
            if kind == pafs.FileType.Directory and not is_ignored(batch):
                per_batch.setdefault(batch, [])
            continue
        if kind != pafs.FileType.File or is_ignored(batch):
            continue
        per_batch.setdefault(batch, []).append((inside, path, info.size or 0, info.mtime_ns or 0))
    return {name: _state(name, entries) for name, entries in sorted(per_batch.items())}


def _state(name: str, entries: list[tuple[str, str, int, int]]) -> BatchState:
    """Counts and a fingerprint of one batch from its (path inside the batch, path, size, mtime) entries."""
    digest = hashlib.sha256()
    in_progress, files, total = [], 0, 0
    for inside, path, size, mtime in sorted(entries):
        if path.endswith(IN_PROGRESS_SUFFIXES):
            in_progress.append(f"{name}/{inside}")
        if has_hidden_part(inside):
            continue
        files += 1
        total += size
        digest.update(f"{path}\0{size}\0{mtime}\n".encode())
    return BatchState(name, files, total, digest.hexdigest()[:16], tuple(in_progress))
