"""The lake: where assets write their tables, on a local disk, on HDFS or over WebHDFS.

One `Lake` speaks URIs that both Spark (through Hadoop's filesystems) and pyarrow accept, so an asset can
let Spark write a table and then inspect or commit it from the driver with the same string.

Partitioned tables use hive-style `batch=<key>` folders. A partition is written aside into a hidden
staging folder (readers skip names starting with `.` or `_`) and then swapped in by rename, so readers
never see a half-written partition. The swap is two renames (old aside, new in); a run killed between
them leaves the old version in a hidden `.previous` folder, and the next commit or listing puts it back.

A staging folder's name says who owns it: the process (pid and start time, so a reused pid is no owner)
on which host. The next commit or listing beside it removes the staging folders whose owner is gone (a
killed run), and this process' own once it has dropped or committed them (a failed run whose executors
still wrote files after the driver deleted its staging). Another host's are removed only when older
than STAGING_ORPHAN_AGE_S: from here nothing tells whether their run still lives.
"""

from __future__ import annotations

import functools
import hashlib
import os
import posixpath
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

PARTITION_COLUMN = "batch"
STAGING_ORPHAN_AGE_S = 2 * 24 * 3600  # another host's staging folder older than this is a leftover

# `.staging-<what>-<token>-p<pid>s<process start>h<host hash>`
_STAGING_NAME = re.compile(r"^\.staging-.*-(?P<token>[0-9a-f]{12})-p(?P<pid>\d+)s(?P<start>\d+)h(?P<host>[0-9a-f]{8})$")
_LIVE_STAGING: set[str] = set()  # tokens of this process' staging folders, until committed or dropped
_LIVE_LOCK = threading.Lock()


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

        fs = fsspec.filesystem(scheme, **_webhdfs_options(uri))
        return PyFileSystem(FSSpecHandler(fs)), urlparse(uri).path or "/"
    return pafs.FileSystem.from_uri(uri)


def _webhdfs_options(uri: str) -> dict:
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
    fs: pafs.FileSystem = field(init=False, repr=False)
    _root_path: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = normalize_uri(self.root)
        self.fs, self._root_path = filesystem_for(self.root)

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

    def staging_uri(self, asset: str, partition: str | None = None) -> str:
        """A hidden sibling of the folder `commit` will replace (inside it, the swap would move it away too),
        named after its owner: see the module's docstring."""
        token = uuid.uuid4().hex[:12]
        with _LIVE_LOCK:
            _LIVE_STAGING.add(token)
        owner = f"{token}-p{os.getpid()}s{_process_start(os.getpid())}h{_host_tag()}"
        if partition is None:
            return self.uri(f".staging-{asset}-{owner}")
        return self.uri(asset, f".staging-{PARTITION_COLUMN}={partition}-{owner}")

    def drop_staging(self, staging_uri: str) -> None:
        """Delete a staging folder this process gave up on; files written into it later are swept next time."""
        _release(staging_uri)
        self.delete(staging_uri)

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

    def data_files(self, uri: str, suffix: str = ".parquet", recursive: bool = True) -> list[str]:
        """Visible data files under `uri` (hidden and `_`-prefixed names skipped, as Spark does), sorted.

        `recursive=False` lists only the folder itself: for a table whose folder also holds many other
        files in subfolders (ernie_generated_images' PNGs), listing those would cost memory per file.
        """
        return visible_files(self.fs, self.fs_path(uri), suffix, recursive)

    def partitions(self, asset: str) -> list[str]:
        """Partition keys that have a committed folder under `<root>/<asset>/`."""
        base = self.fs_path(self.asset_uri(asset))
        if self.fs.get_file_info(base).type != pafs.FileType.Directory:
            return []
        self._tidy(base)
        prefix = f"{PARTITION_COLUMN}="
        keys = [
            posixpath.basename(info.path)[len(prefix) :]
            for info in self.fs.get_file_info(pafs.FileSelector(base))
            if info.type == pafs.FileType.Directory and posixpath.basename(info.path).startswith(prefix)
        ]
        return sorted(keys)

    # --- atomic replace ---------------------------------------------------------------------------
    def commit(self, staging_uri: str, final_uri: str) -> None:
        """Make `staging_uri` visible as `final_uri`, replacing what was there."""
        staging, final = self.fs_path(staging_uri), self.fs_path(final_uri)
        parent = posixpath.dirname(final)
        self._tidy(parent)
        previous = posixpath.join(parent, f".{posixpath.basename(final)}.previous-{uuid.uuid4().hex[:12]}")
        replaced = self.fs.get_file_info(final).type != pafs.FileType.NotFound
        if replaced:
            self.fs.move(final, previous)
        self.fs.move(staging, final)
        _release(staging_uri)
        if replaced:
            self.fs.delete_dir(previous)

    def _tidy(self, parent: str) -> None:
        """Put back a previous version that a killed commit left aside, drop stale leftovers, and sweep the
        staging folders of runs that are over."""
        if self.fs.get_file_info(parent).type != pafs.FileType.Directory:
            return
        for info in self.fs.get_file_info(pafs.FileSelector(parent)):
            name = posixpath.basename(info.path)
            if name.startswith(".staging-"):
                if info.type == pafs.FileType.Directory and _staging_is_leftover(name, info.mtime_ns):
                    self.fs.delete_dir(info.path)
                continue
            if not (name.startswith(".") and ".previous-" in name):
                continue
            final = posixpath.join(parent, name[1:].split(".previous-")[0])
            if self.fs.get_file_info(final).type == pafs.FileType.NotFound:
                self.fs.move(info.path, final)
            else:
                self.fs.delete_dir(info.path)


# --- staging owners -------------------------------------------------------------------------------------------


@functools.cache
def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _process_start(pid: int) -> int:
    """The process' start time in clock ticks since boot (Linux), 0 where unknown: with the pid, it names one
    process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _release(staging_uri: str) -> None:
    match = _STAGING_NAME.match(posixpath.basename(staging_uri.rstrip("/")))
    if match:
        with _LIVE_LOCK:
            _LIVE_STAGING.discard(match["token"])


def _staging_is_leftover(name: str, mtime_ns: int | None) -> bool:
    match = _STAGING_NAME.match(name)
    if match is None or match["host"] != _host_tag():
        # Unknown owner (another host, or a name from before owners were recorded): only age tells.
        return mtime_ns is not None and time.time() - mtime_ns / 1e9 > STAGING_ORPHAN_AGE_S
    pid, start = int(match["pid"]), int(match["start"])
    if pid == os.getpid() and start == _process_start(pid):
        with _LIVE_LOCK:
            return match["token"] not in _LIVE_STAGING
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return start != 0 and _process_start(pid) != start  # the pid now names another process
