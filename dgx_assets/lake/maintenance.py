"""Keeping the lake's tables small and converting the layout of before Iceberg (`dgx-assets lake ...`).

- `expire_snapshots`: drops old snapshots from a table's metadata (never the current one, never the last
  `retain_last`, never one younger than `older_than`: a reader or a rebuild of a training set may still use it).
  A commit that loses a race with a writer is redone on the fresh table, a few times.
- `remove_orphan_files`: deletes files under a table's location that no snapshot of any table references (a
  killed run's files, the files of expired snapshots), only when older than `older_than`: a run still writing
  has not committed its files yet. Also the PNG folders no snapshot names.
- `migrate`: converts the tables of the folder layout (`<lake>/<table>/batch=<key>/*.parquet`) batch by batch:
  each batch's rows are read once, written with their `batch` column into the table's data location and
  committed as that batch's version; only then are the converted files deleted. Run again after an
  interruption, it redoes the batches still in the old layout (a commit replaces the batch, so no row is
  counted twice). What it does not convert stays where it is, and it says so.
- `register_tables`: puts tables whose files are under the warehouse back into an emptied catalog.

What maintenance deletes is bounded before anything is deleted (`check_lake`): only inside a table's own folder
under the warehouse (`<warehouse>/dgx/<table>`) and its PNG folder (`<lake>/<table>/png/<run>`), never through
a symbolic link (links are skipped and listed), and nothing at all when the catalog does not know every table
the warehouse holds (an emptied or replaced catalog would make every earlier file look orphaned). The files are
listed first (`list_orphans`), and the references are read after the listing, again before each group of
deletions (`delete_orphans`): a file a writer committed meanwhile is kept.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow.fs as pafs

from dgx_assets.lake.files import filesystem_for, has_hidden_part, normalize_uri
from dgx_assets.lake.tables import (
    EXPIRE_OLDER_THAN,
    FILES_FOLDER,
    NAMESPACE,
    ORPHAN_OLDER_THAN,
    PARTITION_COLUMN,
    RETAIN_LAST,
    TABLES,
    UNPARTITIONED_TABLES,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from dgx_assets.lake.store import Lake

MIGRATED_FROM = "dgx.migrated-from"  # snapshot property: the folder a migrated batch came from
BLOB_COLUMNS = ("content", "tensor")  # image columns: no dictionary, no statistics (spark/parquet.py)
EXPIRE_ATTEMPTS = 5  # a snapshot expiry that loses a race with a writer is redone on the fresh table
DELETE_GROUP = 200  # the references are read again before each group of deletions
PNG_FOLDER = "png"  # <lake>/<table>/png/<run>: the folders FILES_FOLDER may name


class MaintenanceRefused(RuntimeError):
    """Maintenance found the lake in a state where deleting could lose data; nothing was deleted."""


class MigrationRefused(RuntimeError):
    """The migration found a layout it cannot read; the message says what to move away."""


# --- listing without following links ------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    uri: str
    kind: str  # "file", "dir", "link" (never followed) or "other"
    mtime_ns: int | None


def _is_local(uri: str) -> bool:
    return urlparse(uri).scheme == "file"


def _local_path(uri: str) -> str:
    return filesystem_for(uri)[1]


def _lstat_entry(uri: str) -> Entry | None:
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
            entry = _lstat_entry(f"{uri}/{name}")
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


def _delete(entry: Entry) -> None:
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


def _read_json(uri: str) -> dict | None:
    fs, path = filesystem_for(uri)
    try:
        with fs.open_input_stream(path) as stream:
            found = json.loads(stream.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


# --- where maintenance may delete ---------------------------------------------------------------------------


def table_folder(lake: Lake, name: str) -> str:
    """The folder a table of the lake lives in: `<warehouse>/dgx/<table>` (pyiceberg's default location)."""
    return f"{normalize_uri(lake.tables.warehouse)}/{NAMESPACE}/{name}"


def png_parent(lake: Lake, name: str) -> str:
    """The folder whose subfolders a table's snapshots may name as their files (FILES_FOLDER)."""
    return lake.uri(name, PNG_FOLDER)


def named_folders(table: Table) -> set[str]:
    """The folders (FILES_FOLDER) the table's snapshots name."""
    return {
        normalize_uri(snap.summary.additional_properties[FILES_FOLDER])
        for snap in table.snapshots()
        if snap.summary is not None and FILES_FOLDER in snap.summary.additional_properties
    }


@dataclass(frozen=True)
class MetadataFile:
    uri: str
    table_uuid: str | None  # None: unreadable (a truncated or garbage file)
    last_updated_ms: int


def metadata_files(folder: str) -> list[MetadataFile]:
    """The `*.metadata.json` files in a table folder's `metadata/`, newest last."""
    found = []
    for entry in entries(f"{folder}/metadata"):
        if entry.kind == "file" and entry.uri.endswith(".metadata.json"):
            content = _read_json(entry.uri) or {}
            uuid, updated = content.get("table-uuid"), content.get("last-updated-ms")
            updated = updated if isinstance(updated, int) else -1
            found.append(MetadataFile(entry.uri, uuid if isinstance(uuid, str) else None, updated))
    return sorted(found, key=lambda meta: (meta.last_updated_ms, meta.uri))


def warehouse_tables(lake: Lake) -> dict[str, str]:
    """The table folders under the warehouse (those with metadata files), by table name."""
    namespace = f"{normalize_uri(lake.tables.warehouse)}/{NAMESPACE}"
    return {
        posixpath.basename(entry.uri): entry.uri
        for entry in entries(namespace)
        if entry.kind == "dir" and any(e.uri.endswith(".metadata.json") for e in entries(f"{entry.uri}/metadata"))
    }


def _register_hint(lake: Lake, name: str, newest: str) -> str:
    return (
        f"re-register it with `dgx-assets lake register {name}` (pyiceberg: catalog.register_table(('{NAMESPACE}', "
        f"'{name}'), '{newest}'), its newest metadata file)"
    )


def check_lake(lake: Lake) -> dict[str, Table]:
    """The catalog's tables, once it is sure that maintenance deletes only what is theirs; raises
    MaintenanceRefused otherwise (nothing deleted)."""
    catalog_uri = lake.tables.catalog_uri
    names = lake.tables.names()
    for name, folder in sorted(warehouse_tables(lake).items()):
        if name not in names:
            newest = metadata_files(folder)[-1].uri
            raise MaintenanceRefused(
                f"the catalog {catalog_uri} does not know the table {NAMESPACE}.{name} whose files are in {folder} "
                f"(an emptied or replaced catalog?): nothing was deleted; {_register_hint(lake, name, newest)}"
            )
    tables = {}
    for name in names:
        table = lake.tables.table(name)
        if table is None:
            continue
        expected, location = table_folder(lake, name), normalize_uri(table.location())
        if location != expected:
            raise MaintenanceRefused(
                f"{NAMESPACE}.{name}: its metadata ({table.metadata_location}) names the location {location}, not the "
                f"table's folder {expected} under the warehouse: nothing was deleted (an edited or copied metadata file?)"
            )
        if _is_local(expected):
            namespace = posixpath.dirname(expected)
            for path in (namespace, expected):
                if os.path.islink(_local_path(path)):
                    raise MaintenanceRefused(
                        f"{NAMESPACE}.{name}: {path} is a symbolic link: maintenance deletes nothing through a link"
                    )
        for folder in sorted(named_folders(table)):
            run = posixpath.basename(folder)
            if posixpath.dirname(folder) != png_parent(lake, name) or run in ("", ".", ".."):
                raise MaintenanceRefused(
                    f"{NAMESPACE}.{name}: a snapshot names the files folder {folder} ({FILES_FOLDER}), which is not a "
                    f"folder of {png_parent(lake, name)}: nothing was deleted (an edited metadata file?)"
                )
        listed = {normalize_uri(table.metadata_location), *(normalize_uri(e.metadata_file) for e in table.metadata.metadata_log)}
        uuid = str(table.metadata.table_uuid)
        others = [meta for meta in metadata_files(expected) if meta.table_uuid not in (None, uuid) and meta.uri not in listed]
        if others:
            raise MaintenanceRefused(
                f"{NAMESPACE}.{name}: {expected} also holds the metadata of another table (uuid {others[-1].table_uuid}, "
                f"newest {others[-1].uri}) than the catalog's (uuid {uuid}): the catalog was emptied or replaced and a "
                "commit created a new table over the old one; nothing was deleted. To keep the earlier table, drop the "
                f"catalog's entry (catalog.drop_table(('{NAMESPACE}', '{name}')), files stay) and "
                f"{_register_hint(lake, name, others[-1].uri)}, then commit again what was committed since"
            )
        tables[name] = table
    return tables


# --- snapshot expiry ------------------------------------------------------------------------------------------


def expire_snapshots(
    lake: Lake, name: str, older_than: dt.timedelta = EXPIRE_OLDER_THAN, retain_last: int = RETAIN_LAST
) -> list[int]:
    """Expire the snapshots of a table that are older than `older_than` and not among the last `retain_last`;
    redone on the fresh table when a writer committed meanwhile."""
    from pyiceberg.exceptions import CommitFailedException
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

    @retry(
        retry=retry_if_exception_type(CommitFailedException),
        stop=stop_after_attempt(EXPIRE_ATTEMPTS),
        wait=wait_random_exponential(multiplier=0.1, max=5),
        reraise=True,
    )
    def attempt() -> list[int]:
        table = lake.tables.table(name)  # loaded again on each attempt: the writer's snapshot is in
        current = table.current_snapshot() if table is not None else None
        if table is None or current is None:
            return []
        cutoff_ms = (dt.datetime.now(dt.UTC) - older_than).timestamp() * 1000
        snapshots = sorted(table.snapshots(), key=lambda snap: snap.timestamp_ms)
        kept = {snap.snapshot_id for snap in snapshots[-retain_last:]} | {current.snapshot_id}
        expired = [s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff_ms and s.snapshot_id not in kept]
        if expired:
            table.maintenance.expire_snapshots().by_ids(expired).commit()
        return expired

    return attempt()


# --- orphan files -------------------------------------------------------------------------------------------


def referenced_files(table: Table) -> set[str]:
    """Every file a table's metadata still points at: metadata files, manifest lists, manifests, data files."""
    io = table.io
    metadata = table.metadata
    files = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    files |= {stats.statistics_path for stats in metadata.statistics}
    for snap in metadata.snapshots:
        files.add(snap.manifest_list)
        for manifest in snap.manifests(io):
            files.add(manifest.manifest_path)
            files |= {entry.data_file.file_path for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)}
    return {normalize_uri(path) for path in files}


def all_references(lake: Lake) -> set[str]:
    """The files and folders any snapshot of any table of the catalog names, read now from the catalog."""
    keep: set[str] = set()
    for name in lake.tables.names():
        table = lake.tables.table(name)
        if table is not None:
            keep |= referenced_files(table) | named_folders(table)
    return keep


@dataclass
class Listing:
    """What maintenance may delete of one table: the files and PNG folders older than the cutoff, found without
    following links (the links found are in `links`, never deleted)."""

    table: str
    cutoff_ns: float
    candidates: list[Entry] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def list_orphans(lake: Lake, table: Table, name: str, older_than: dt.timedelta = ORPHAN_OLDER_THAN) -> Listing:
    """The first half of orphan removal: the old entries under the table's folder (checked by `check_lake`)
    and, when its snapshots name PNG folders, the old folders of its PNG folder. Nothing is read of the
    references here: `delete_orphans` reads them after this listing."""
    listing = Listing(name, (dt.datetime.now(dt.UTC) - older_than).timestamp() * 1e9)

    def take(entry: Entry, kind: str) -> None:
        if entry.kind == "link":
            listing.links.append(entry.uri)
        elif entry.kind == kind and entry.mtime_ns is not None and entry.mtime_ns < listing.cutoff_ns:
            listing.candidates.append(entry)

    for entry in entries(table_folder(lake, name), recursive=True):
        take(entry, "file")
    if named_folders(table):
        for entry in entries(png_parent(lake, name)):
            take(entry, "dir")
    return listing


def delete_orphans(lake: Lake, listing: Listing, dry_run: bool = False) -> list[str]:
    """The second half: the listed entries that no snapshot of any table names, the references read again before
    each group; an entry that changed since the listing (younger now, a link now, gone) is kept."""
    removed = []
    for start in range(0, len(listing.candidates), DELETE_GROUP):
        keep = all_references(lake)
        for entry in listing.candidates[start : start + DELETE_GROUP]:
            if entry.uri in keep:
                continue
            now = _lstat_entry(entry.uri)
            if now is None or now.kind != entry.kind or now.mtime_ns is None or now.mtime_ns >= listing.cutoff_ns:
                continue
            if not dry_run:
                _delete(now)
            removed.append(entry.uri)
    return removed


def remove_orphan_files(lake: Lake, name: str, older_than: dt.timedelta = ORPHAN_OLDER_THAN, dry_run: bool = False) -> list[str]:
    """Delete the files under a table's folder that no snapshot of any table references, and its PNG folders
    that no snapshot names, when older than `older_than`. Returns their URIs. Refused (MaintenanceRefused) when
    the lake is not in a state where that is safe."""
    table = check_lake(lake).get(name)
    if table is None:
        return []
    return delete_orphans(lake, list_orphans(lake, table, name, older_than), dry_run)


def maintain(
    lake: Lake,
    expire_older_than: dt.timedelta = EXPIRE_OLDER_THAN,
    retain_last: int = RETAIN_LAST,
    orphan_older_than: dt.timedelta = ORPHAN_OLDER_THAN,
    dry_run: bool = False,
) -> dict[str, dict]:
    """Snapshot expiry, then orphan-file removal, on every table of the catalog; killed swaps' leftovers too.
    Refused as a whole, nothing deleted, when `check_lake` refuses."""
    report = {}
    tables = check_lake(lake)
    for name in sorted(tables):
        expired = [] if dry_run else expire_snapshots(lake, name, expire_older_than, retain_last)
        table = lake.tables.table(name) or tables[name]
        listing = list_orphans(lake, table, name, orphan_older_than)
        report[name] = {
            "expired_snapshots": expired,
            "removed_files": delete_orphans(lake, listing, dry_run),
            "skipped_links": listing.links,
        }
    if not dry_run:
        report["(folders)"] = {"removed_staging": lake.sweep_staging(orphan_older_than.total_seconds())}
    return report


def register_tables(lake: Lake, names: list[str] | None = None) -> dict[str, str]:
    """Register into the catalog the tables whose folders are under the warehouse but that the catalog does not
    know (an emptied catalog), each from its newest metadata file. Returns the metadata file per table."""
    known = set(lake.tables.names())
    folders = warehouse_tables(lake)
    for name in names or []:
        if name not in folders:
            raise MaintenanceRefused(f"the warehouse {lake.tables.warehouse} holds no table {NAMESPACE}.{name}")
    registered = {}
    for name, folder in sorted(folders.items()):
        if (names and name not in names) or name in known:
            continue
        readable = [meta for meta in metadata_files(folder) if meta.table_uuid is not None]
        if not readable:
            raise MaintenanceRefused(f"{folder} holds no readable metadata file: {NAMESPACE}.{name} cannot be registered")
        lake.tables.catalog.register_table((NAMESPACE, name), readable[-1].uri)
        registered[name] = readable[-1].uri
    return registered


# --- migration of the folder layout --------------------------------------------------------------------------


def _valid_key(key: str) -> bool:
    return bool(key) and not key.startswith((".", "_")) and key.isprintable()


@dataclass
class LegacyLayout:
    """One table's folder in the layout of before Iceberg: the files the migration converts (by batch; None for
    the unpartitioned table's top) and what it leaves in place."""

    batches: dict[str | None, list[str]] = field(default_factory=dict)  # batch -> file URIs
    left: list[str] = field(default_factory=list)


def legacy_layout(lake: Lake, name: str) -> LegacyLayout:
    """What `migrate` converts of a table: Parquet files directly in `batch=<key>/` folders with a valid key (the
    unpartitioned table: the Parquet files at its folder's top); links are never followed, and everything else
    (other files and folders, hidden ones, links) is left in place and listed."""
    layout = LegacyLayout()
    top = _lstat_entry(lake.uri(name))
    if top is None:
        return layout
    if top.kind != "dir":
        layout.left.append(top.uri)
        return layout

    def parquet(entry: Entry) -> bool:
        base = posixpath.basename(entry.uri)
        return entry.kind == "file" and base.endswith(".parquet") and not has_hidden_part(base)

    for entry in entries(top.uri):
        base = posixpath.basename(entry.uri)
        if name in UNPARTITIONED_TABLES:
            if parquet(entry):
                layout.batches.setdefault(None, []).append(entry.uri)
            elif not (base == PNG_FOLDER and entry.kind == "dir"):  # the PNGs the rows name stay
                layout.left.append(entry.uri)
            continue
        key = base.removeprefix(f"{PARTITION_COLUMN}=")
        if entry.kind != "dir" or not base.startswith(f"{PARTITION_COLUMN}=") or not _valid_key(key):
            layout.left.append(entry.uri)
            continue
        for inner in entries(entry.uri):
            if parquet(inner):
                layout.batches.setdefault(key, []).append(inner.uri)
            else:
                layout.left.append(inner.uri)
    return layout


def migrate(lake: Lake, log: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Convert every table of the lake that is still in the folder layout; returns the batches (or `*` for an
    unpartitioned table) migrated per table. What it does not convert is logged, and stays in place."""
    done: dict[str, list[str]] = {}
    lake.tables.allow_legacy = True  # this is the command the refusal names
    try:
        for name in TABLES:
            layout = legacy_layout(lake, name)
            for batch, files in sorted(layout.batches.items(), key=lambda item: item[0] or ""):
                _migrate_files(lake, name, files, batch, log)
                _remove_if_empty(posixpath.dirname(files[0]) if batch is not None else None)
                done.setdefault(name, []).append(batch if batch is not None else "*")
            if name not in UNPARTITIONED_TABLES:
                _remove_if_empty(lake.uri(name))
            for uri in layout.left:
                log(f"{name}: left in place, not converted: {uri}")
    finally:
        lake.tables.allow_legacy = False
    return done


def _remove_if_empty(folder: str | None) -> None:
    if folder is None:
        return
    entry = _lstat_entry(folder)
    if entry is not None and entry.kind == "dir" and next(entries(folder), None) is None:
        _delete(entry)


def _migrate_files(lake: Lake, name: str, uris: list[str], batch: str | None, log: Callable[[str], None]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dgx_assets.spark.table_writer import write_parquet

    what = f"{name}{f'[{batch}]' if batch else ''}"
    old_folder = posixpath.dirname(uris[0])
    schemas, rows = [], 0
    for uri in uris:  # every file is read before anything is written: a layout it cannot read changes nothing
        fs, path = filesystem_for(uri)
        try:
            with fs.open_input_file(path) as handle:
                parquet = pq.ParquetFile(handle)
                schemas.append(parquet.schema_arrow)
                rows += parquet.metadata.num_rows
        except (OSError, ValueError) as error:
            raise MigrationRefused(
                f"{uri} is not a Parquet file the migration can read ({' '.join(str(error).split())}): move it out of "
                f"{old_folder} and run `dgx-assets lake migrate` again; nothing of {what} was changed"
            ) from None
    first = schemas[0]
    schema = first if batch is None else pa.schema([*first, pa.field(PARTITION_COLUMN, pa.string())])
    written: list[str] = []

    def write(folder: str) -> list[str]:
        fs, path = filesystem_for(folder)
        fs.create_dir(path, recursive=True)
        for number, source in enumerate(uris):
            source_fs, source_path = filesystem_for(source)
            with source_fs.open_input_file(source_path) as handle:
                parquet = pq.ParquetFile(handle)
                batches = (_with_batch(parquet.read_row_group(i), batch) for i in range(parquet.num_row_groups))
                target = f"{folder}/part-{number:05d}.parquet"
                write_parquet(
                    fs, f"{path}/part-{number:05d}.parquet", schema, (b for t in batches for b in t.to_batches()), BLOB_COLUMNS
                )
                written.append(target)
        return written

    # The PNG files of ernie_generated_images stay where they are: the rows' png_path names them.
    snapshot_id = lake.tables.write_and_commit(name, schema, write, batch, properties={MIGRATED_FROM: old_folder})
    landed = lake.tables.snapshot(name, snapshot_id, batch).dataset().count_rows()
    if landed != rows:  # the old files stay: nothing is lost
        raise RuntimeError(f"{what}: {landed} rows committed for {rows} in {old_folder}")
    log(f"{what}: {rows} rows from {old_folder} -> snapshot {snapshot_id}")
    for source in uris:
        entry = _lstat_entry(source)
        if entry is not None and entry.kind == "file":
            _delete(entry)


def _with_batch(table, batch: str | None):
    import pyarrow as pa

    if batch is None or PARTITION_COLUMN in table.column_names:
        return table
    return table.append_column(PARTITION_COLUMN, pa.array([batch] * table.num_rows, pa.string()))
