"""A lock between processes on one machine: an advisory lock on a file, released when the holder exits or dies."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Held inside the block; `path` (created if missing) is the lock file other processes wait on."""
    lock_path = Path(path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield
