"""Keeping the lake's tables small (`dgx-assets lake maintain`, `lake register`).

- `expire_snapshots`: drops old snapshots from a table's metadata (never the current one, never the last
  `retain_last`, never one younger than `older_than`: a reader or a rebuild of a training set may still use it).
  A commit that loses a race with a writer is redone on the fresh table, a few times.
- `remove_orphan_files`: deletes files under a table's location that no snapshot of any table references (a
  killed run's files, the files of expired snapshots), only when older than `older_than`: a run still writing
  has not committed its files yet. Also the PNG folders no snapshot names.
- `register_tables`: puts tables whose files are under the warehouse back into an emptied catalog.

What maintenance deletes is bounded before anything is deleted (`check_lake`): only inside a table's own folder
under the warehouse (`<warehouse>/dgx/<table>`) and its PNG folder (`<lake>/<table>/png/<run>`), never through
a symbolic link (links are skipped and listed), and nothing at all when the catalog does not know every table
the warehouse holds (an emptied or replaced catalog would make every earlier file look orphaned). The files are
listed first (`list_orphans`), and the references are read after the listing, again before each group of
deletions (`delete_orphans`): a file a writer committed meanwhile is kept. The conversion of the layout of before
Iceberg is `migration.py`.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dgx_assets.lake.files import normalize_uri
from dgx_assets.lake.listing import Entry, delete_entry, entries, lstat_entry, read_json
from dgx_assets.lake.tables import (
    EXPIRE_OLDER_THAN,
    FILES_FOLDER,
    NAMESPACE,
    ORPHAN_OLDER_THAN,
    RETAIN_LAST,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from dgx_assets.lake.store import Lake

EXPIRE_ATTEMPTS = 5  # a snapshot expiry that loses a race with a writer is redone on the fresh table
DELETE_GROUP = 200  # the references are read again before each group of deletions
PNG_FOLDER = "png"  # <lake>/<table>/png/<run>: the folders FILES_FOLDER may name


class MaintenanceRefused(RuntimeError):
    """Maintenance found the lake in a state where deleting could lose data; nothing was deleted."""


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
            content = read_json(entry.uri) or {}
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
        for path in (posixpath.dirname(expected), expected):
            entry = lstat_entry(path)
            if entry is not None and entry.kind == "link":
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
            now = lstat_entry(entry.uri)
            if now is None or now.kind != entry.kind or now.mtime_ns is None or now.mtime_ns >= listing.cutoff_ns:
                continue
            if not dry_run:
                delete_entry(now)
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
