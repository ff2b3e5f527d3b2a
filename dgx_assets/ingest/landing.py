"""Looking at the landing zone: which batch folders exist, what each holds, and whether it is still being written.

One listing serves the landing sensor and ingest alike. Landing zones are hostile: a symbolic link may
point out of the zone or back into a parent folder, a FIFO blocks whoever opens it, a folder may refuse
to be listed. So the listing never follows a link (it records it), never opens anything (the type comes
from the directory entry or an lstat), and an entry it cannot read costs only its own batch: each such
entry is kept as a `Refused` entry with a status and a reason, and ingest gives it a raw_images row.

A batch is fingerprinted from the names, sizes and modification times of its visible files (plus its
refused entries, when it has any), so the sensor's cursor holds one short hash per batch however many
files land. A batch is ready when it holds no file still being copied and its fingerprint is the same on
two looks in a row. Hidden and `_`-prefixed files and folders are not looked at (Spark and ingest skip them too).
"""

from __future__ import annotations

import hashlib
import operator
import os
import posixpath
import stat
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from dgx_assets.ingest.images import BAD_NAME, SPECIAL_FILE, SYMLINK, UNLISTABLE
from dgx_assets.lake.files import batch_name, filesystem_for, has_hidden_part

# What a Dagster partition key cannot hold (dagster's INVALID_PARTITION_SUBSTRINGS): such a folder is no batch.
_UNNAMEABLE = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")

# HDFS `put` writes `<name>._COPYING_` and renames at the end; other tools leave these while writing.
IN_PROGRESS_SUFFIXES = ("._COPYING_", ".tmp", ".part", ".crdownload")


@dataclass(frozen=True)
class Refused:
    """An entry the listing did not follow or could not read: a link, a special file, an unlistable folder."""

    path: str  # as the filesystem names it
    status: str  # one of images.REFUSED_STATUSES
    reason: str


@dataclass
class BatchListing:
    files: list[tuple[str, int, int]] = field(default_factory=list)  # visible regular files: (path, size, mtime_ns)
    refused: list[Refused] = field(default_factory=list)


@dataclass(frozen=True)
class BatchState:
    name: str
    files: int
    total_bytes: int
    fingerprint: str
    in_progress: tuple[str, ...]  # files still being written
    refused: tuple[Refused, ...] = ()  # entries recorded but not read (links, special files, unlistable folders)
    production_files: int = 0  # directly in the batch folder, not in a label folder: to be scored, not trained on

    @property
    def complete(self) -> bool:
        return not self.in_progress and self.files > 0

    def refused_summary(self, root: str) -> str:
        """`2 entries not read: a/x (symlink), b (unlistable)`, for the sensor's tick and run tags."""
        names = [f"{entry.path[len(root) :].lstrip('/')} ({entry.status})" for entry in self.refused[:5]]
        more = f", and {len(self.refused) - 5} more" if len(self.refused) > 5 else ""
        return f"{len(self.refused)} entr{'y' if len(self.refused) == 1 else 'ies'} not read: {', '.join(names)}{more}"


@dataclass(frozen=True)
class Landing:
    root: str  # the landing zone's path in its filesystem
    batches: dict[str, BatchState]
    refused: tuple[Refused, ...]  # top-level entries that are not batch folders (links, special files)


@dataclass(frozen=True)
class LandedBatch:
    """One batch as ingest sees it: where it is, what it holds, and the fingerprint the sensor compares."""

    fs: pafs.FileSystem
    path: str  # the batch folder's path in `fs`
    listing: BatchListing
    state: BatchState


def is_ignored(name: str) -> bool:
    """Hidden files and `_SUCCESS`-style markers are never ingested."""
    return name.startswith((".", "_"))


def look(landing_uri: str) -> Landing:
    """Every batch folder under the landing zone and what it holds, plus the top-level entries refused."""
    fs, root = filesystem_for(landing_uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return Landing(root, {}, ())
    # Local zones: os.scandir's entries carry the file type for free, where pyarrow's listing costs twice the
    # walk on 100,000 files (bench/code_location.py) and follows links. HDFS goes through pyarrow, where the
    # namenode's round trips dominate.
    if isinstance(fs, pafs.LocalFileSystem):
        listings, refused = _walk_local(root)
    else:
        listings, refused = _list_remote(fs, root)
    named = _batch_names(root, listings, refused)
    batches = {name: batch_state(name, root, listings[folder]) for name, folder in sorted(named.items())}
    return Landing(root, batches, tuple(sorted(refused, key=lambda entry: entry.path)))


def _batch_names(root: str, listings: dict[str, BatchListing], refused: list[Refused]) -> dict[str, str]:
    """Batch name -> its folder's name. A batch is named by its folder's NFC form (`batch_name`), so the NFD
    spelling of `café` is the same batch; when both spellings land, the NFC folder is the batch and the other
    is refused. A name no partition key can hold is refused too. Each refusal is recorded with its reason."""
    named: dict[str, str] = {}
    # NFC spellings first, so they win over another spelling of the same name.
    for folder in sorted(listings, key=lambda folder: (batch_name(folder) != folder, folder)):
        name, path = batch_name(folder), posixpath.join(root, folder)
        if any(part in name for part in _UNNAMEABLE):
            reason = "the name holds a control character or '...', which no Dagster partition key can hold: rename it"
            refused.append(Refused(path, BAD_NAME, reason))
        elif name in named:
            reason = (
                f"the same name as the batch folder {named[name]!r} in another Unicode form (NFC/NFD): one batch "
                "cannot be two folders; merge it into that folder"
            )
            refused.append(Refused(path, BAD_NAME, reason))
        else:
            named[name] = folder
    return named


def scan_landing(landing_uri: str) -> dict[str, BatchState]:
    """Every batch folder under the landing zone, in one listing."""
    return look(landing_uri).batches


def look_at_batch(batch_uri: str) -> LandedBatch:
    """One batch folder, listed exactly as the sensor lists it (same entries, same fingerprint).

    `batch_uri` is the landing zone's URI, `/`, then the batch's name as it is (never unquoted: `50%` is the
    batch `50%`). The batch `café` is found in a folder spelt in NFD when no NFC folder is there.
    """
    parent, _, name = batch_uri.rstrip("/").rpartition("/")
    # Only the landing zone's own path is resolved: the batch folder itself may be a link, never followed.
    fs, root = filesystem_for(parent or "/")
    name = batch_name(name)
    path = posixpath.join(root, name)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        spelt = [
            info.path
            for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
            if batch_name(posixpath.basename(info.path)) == name
        ]
        path = min(spelt, default=path)
    if isinstance(fs, pafs.LocalFileSystem):
        listing = _walk_local_batch(path)
    else:
        listing = _list_remote_batch(fs, path)
    return LandedBatch(fs, path, listing, batch_state(name, root, listing))


# --- local: os.scandir, links never followed ------------------------------------------------------------


def _walk_local(root: str) -> tuple[dict[str, BatchListing], list[Refused]]:
    listings: dict[str, BatchListing] = {}
    refused: list[Refused] = []
    with os.scandir(root) as top:
        for entry in top:
            if is_ignored(entry.name):
                continue
            if not entry.name.isascii() and not _is_utf8(entry.name):
                refused.append(_misnamed(entry.path))  # no partition key can hold it: not a batch
            elif entry.is_dir(follow_symlinks=False):
                listings[entry.name] = _walk_local_batch(entry.path)
            # Loose files at the top are no batch: skipped. Links and special files are named in the tick.
            elif not entry.is_file(follow_symlinks=False) and (kind := _refuse(entry)) is not None:
                refused.append(kind)
    return listings, refused


def _walk_local_batch(path: str) -> BatchListing:
    listing = BatchListing()
    if os.path.islink(path):  # a batch folder that is a link: not followed, wherever it points
        listing.refused.append(_link(path))
        return listing
    folders = [path]
    add_file = listing.files.append  # looked up once: this loop runs for every landed file
    while folders:
        folder = folders.pop()
        try:
            entries = os.scandir(folder)
        except FileNotFoundError:  # removed since its parent was read
            continue
        except OSError as error:  # forbidden, not a folder any more, an I/O error: this folder only
            listing.refused.append(Refused(folder, UNLISTABLE, f"the folder cannot be listed: {_describe(error)}"))
            continue
        with entries:
            for entry in entries:
                if is_ignored(entry.name):
                    continue
                if not entry.name.isascii() and not _is_utf8(entry.name):
                    listing.refused.append(_misnamed(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        # Renamed since the folder was read (a copy tool finishing): the next look sees the
                        # result, and the changed fingerprint holds the batch back.
                        continue
                    add_file((entry.path, info.st_size, info.st_mtime_ns))
                elif (refused := _refuse(entry)) is not None:
                    listing.refused.append(refused)
    return listing


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def _refuse(entry: os.DirEntry) -> Refused | None:
    """A link or a special file, from its directory entry and an lstat; None when it vanished meanwhile."""
    if entry.is_symlink():
        return _link(entry.path)
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    kind = next((name for test, name in _SPECIAL_KINDS if test(mode)), f"file of type {stat.S_IFMT(mode):o}")
    return Refused(entry.path, SPECIAL_FILE, f"a {kind}: special files are never opened")


def _link(path: str) -> Refused:
    try:
        target = os.readlink(path)  # reads the link itself, never its target
    except OSError as error:
        target = f"? ({_describe(error)})"
    return Refused(
        path,
        SYMLINK,
        f"a symbolic link to {target}: links are not followed, so nothing outside the "
        "landing zone is read; copy the file itself into the batch",
    )


def _is_utf8(name: str) -> bool:
    """os.scandir hands over the bytes of a name that is not UTF-8 as lone surrogates, which nothing can encode."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _misnamed(path: str) -> Refused:
    shown = os.fsencode(path).decode("utf-8", errors="backslashreplace")  # the byte 0xff shows as \xff
    return Refused(shown, BAD_NAME, "the name is not valid UTF-8, so no table or partition key can hold it: rename it")


def _describe(error: OSError) -> str:
    return f"{type(error).__name__}: {error.strerror or error}"


# --- remote: pyarrow (HDFS, WebHDFS), one listing per batch ---------------------------------------------


def _list_remote(fs: pafs.FileSystem, root: str) -> tuple[dict[str, BatchListing], list[Refused]]:
    listings: dict[str, BatchListing] = {}
    refused: list[Refused] = []
    for info in fs.get_file_info(pafs.FileSelector(root)):
        path, kind = info.path, info.type
        name = posixpath.basename(path)
        if is_ignored(name):
            continue
        if kind == pafs.FileType.Directory:
            # One listing per batch, so a folder that cannot be listed costs only its batch.
            listings[name] = _list_remote_batch(fs, path)
        elif kind != pafs.FileType.File:
            refused.append(Refused(path, SPECIAL_FILE, "an entry of unknown type: never opened"))
    return listings, refused


def _list_remote_batch(fs: pafs.FileSystem, path: str) -> BatchListing:
    listing = BatchListing()
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as error:
        listing.refused.append(Refused(path, UNLISTABLE, f"the folder cannot be listed: {type(error).__name__}: {error}"))
        return listing
    for info in infos:
        # Each FileInfo property builds a new Python object: read each once.
        file_path, kind = info.path, info.type
        if has_hidden_part(file_path[len(path) :].lstrip("/")):
            continue
        if kind == pafs.FileType.File:
            listing.files.append((file_path, info.size or 0, info.mtime_ns or 0))
        elif kind != pafs.FileType.Directory:
            listing.refused.append(Refused(file_path, SPECIAL_FILE, "an entry of unknown type: never opened"))
    return listing


# --- fingerprint ---------------------------------------------------------------------------------------


def batch_state(name: str, root: str, listing: BatchListing) -> BatchState:
    """Counts and a fingerprint of one batch from its listing.

    The fingerprint is what the sensor's cursor and raw_images' materializations hold: its formula must not
    change for a batch of plain files, or every batch runs again.
    """
    files = listing.files
    # One line per file; sorting the lines sorts by path ("\0" ends each path and sorts first), and is
    # cheaper than sorting the tuples. Refused entries add a line each (a link appearing changes the batch).
    lines = [f"{path}\0{size}\0{mtime}\n" for path, size, mtime in files]
    if listing.refused:
        lines += [f"{entry.path}\0{entry.status}\n" for entry in listing.refused]
    lines.sort()
    text = "".join(lines)
    in_progress: tuple[str, ...] = ()
    if any(f"{suffix}\0" in text for suffix in IN_PROGRESS_SUFFIXES):  # one scan of the text; rarely true
        copying = sorted(path for path, _, _ in files if path.endswith(IN_PROGRESS_SUFFIXES))
        in_progress = tuple(path[len(root) :].lstrip("/") for path in copying)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    refused = tuple(sorted(listing.refused, key=lambda entry: entry.path))
    start = len(root.rstrip("/")) + 1
    production = sum(1 for path, _, _ in files if path.count("/", start) == 1)  # `<batch>/<file>`: no label folder
    return BatchState(name, len(files), sum(map(operator.itemgetter(1), files)), digest, in_progress, refused, production)
