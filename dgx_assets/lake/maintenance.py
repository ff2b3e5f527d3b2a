"""Keeping the lake's tables small and converting the layout of before Iceberg (`dgx-assets lake ...`).

- `expire_snapshots`: drops old snapshots from a table's metadata (never the current one, never the last
  `retain_last`, never one younger than `older_than`: a reader or a rebuild of a training set may still use it).
- `remove_orphan_files`: deletes files under a table's location that no kept snapshot references (a killed
  run's files, the files of expired snapshots), only when older than `older_than`: a run still writing has
  not committed its files yet. Also the PNG folders no kept snapshot names, and killed folder swaps' leftovers.
- `migrate`: converts the tables of the folder layout (`<lake>/<table>/batch=<key>/*.parquet`) batch by batch:
  each batch's rows are read once, written with their `batch` column into the table's data location and
  committed as that batch's version; only then is the old folder deleted. Run again after an interruption,
  it redoes the batches still in the old layout (a commit replaces the batch, so no row is counted twice).
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from dgx_assets.lake.files import filesystem_for, normalize_uri
from dgx_assets.lake.tables import (
    EXPIRE_OLDER_THAN,
    FILES_FOLDER,
    ORPHAN_OLDER_THAN,
    PARTITION_COLUMN,
    RETAIN_LAST,
    TABLES,
    UNPARTITIONED_TABLES,
)

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake

MIGRATED_FROM = "dgx.migrated-from"  # snapshot property: the folder a migrated batch came from
BLOB_COLUMNS = ("content", "tensor")  # image columns: no dictionary, no statistics (spark/parquet.py)


def expire_snapshots(
    lake: Lake, name: str, older_than: dt.timedelta = EXPIRE_OLDER_THAN, retain_last: int = RETAIN_LAST
) -> list[int]:
    """Expire the snapshots of a table that are older than `older_than` and not among the last `retain_last`."""
    table = lake.tables.table(name)
    current = table.current_snapshot() if table is not None else None
    if table is None or current is None:
        return []
    cutoff_ms = (dt.datetime.now(dt.UTC) - older_than).timestamp() * 1000
    snapshots = sorted(table.snapshots(), key=lambda snap: snap.timestamp_ms)
    kept = {snap.snapshot_id for snap in snapshots[-retain_last:]} | {current.snapshot_id}
    expired = [snap.snapshot_id for snap in snapshots if snap.timestamp_ms < cutoff_ms and snap.snapshot_id not in kept]
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    return expired


def referenced_files(table) -> set[str]:
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


def remove_orphan_files(lake: Lake, name: str, older_than: dt.timedelta = ORPHAN_OLDER_THAN, dry_run: bool = False) -> list[str]:
    """Delete the files under a table's location that no snapshot references, and its PNG folders that no
    snapshot names, when older than `older_than`. Returns their URIs."""
    table = lake.tables.table(name)
    if table is None:
        return []
    cutoff_ns = (dt.datetime.now(dt.UTC) - older_than).timestamp() * 1e9
    files = _sweep(
        normalize_uri(table.location()), pafs.FileType.File, referenced_files(table), cutoff_ns, dry_run, recursive=True
    )
    # Folders of files that belong to a version (FILES_FOLDER), beside those that kept snapshots name.
    named = {
        normalize_uri(snap.summary.additional_properties[FILES_FOLDER])
        for snap in table.snapshots()
        if snap.summary is not None and FILES_FOLDER in snap.summary.additional_properties
    }
    parents = {posixpath.dirname(folder) for folder in named}
    return files + [uri for parent in parents for uri in _sweep(parent, pafs.FileType.Directory, named, cutoff_ns, dry_run)]


def _sweep(uri: str, kind: pafs.FileType, keep: set[str], cutoff_ns: float, dry_run: bool, recursive: bool = False) -> list[str]:
    """Delete the entries of `kind` under the folder `uri` that `keep` does not name and that are older than the
    cutoff; returns their URIs."""
    fs, root = filesystem_for(uri)
    removed = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=recursive, allow_not_found=True)):
        entry = f"{uri}/{info.path[len(root) :].lstrip('/')}"
        if info.type == kind and info.mtime_ns is not None and info.mtime_ns < cutoff_ns and entry not in keep:
            removed.append(entry)
            if not dry_run:
                (fs.delete_file if kind == pafs.FileType.File else fs.delete_dir)(info.path)
    return removed


def maintain(
    lake: Lake,
    expire_older_than: dt.timedelta = EXPIRE_OLDER_THAN,
    retain_last: int = RETAIN_LAST,
    orphan_older_than: dt.timedelta = ORPHAN_OLDER_THAN,
    dry_run: bool = False,
) -> dict[str, dict]:
    """Snapshot expiry, then orphan-file removal, on every table of the catalog; killed swaps' leftovers too."""
    report = {}
    for name in lake.tables.names():
        expired = [] if dry_run else expire_snapshots(lake, name, expire_older_than, retain_last)
        report[name] = {
            "expired_snapshots": expired,
            "removed_files": remove_orphan_files(lake, name, orphan_older_than, dry_run),
        }
    if not dry_run:
        report["(folders)"] = {"removed_staging": lake.sweep_staging(orphan_older_than.total_seconds())}
    return report


# --- migration of the folder layout --------------------------------------------------------------------------


def migrate(lake: Lake, log: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Convert every table of the lake that is still in the folder layout; returns the batches (or `*` for an
    unpartitioned table) migrated per table."""
    done: dict[str, list[str]] = {}
    lake.tables.allow_legacy = True  # this is the command the refusal names
    try:
        for name in TABLES:
            _migrate_table(lake, name, done, log)
    finally:
        lake.tables.allow_legacy = False
    return done


def _migrate_table(lake: Lake, name: str, done: dict[str, list[str]], log: Callable[[str], None]) -> None:
    files = lake.tables.legacy_files(name)
    if not files:
        return
    if name in UNPARTITIONED_TABLES:
        _migrate_files(lake, name, files, None, log)
        done[name] = ["*"]
        return
    by_batch: dict[str, list[str]] = {}
    for path in files:
        folder = posixpath.dirname(path)
        by_batch.setdefault(posixpath.basename(folder).removeprefix(f"{PARTITION_COLUMN}="), []).append(path)
    for batch, batch_files in sorted(by_batch.items()):
        _migrate_files(lake, name, batch_files, batch, log)
    done[name] = sorted(by_batch)
    lake.delete(lake.uri(name))


def _migrate_files(lake: Lake, name: str, paths: list[str], batch: str | None, log: Callable[[str], None]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dgx_assets.spark.table_writer import write_parquet

    first = pq.ParquetFile(lake.fs.open_input_file(paths[0])).schema_arrow
    schema = first if batch is None else pa.schema([*first, pa.field(PARTITION_COLUMN, pa.string())])
    old_folder = lake.uri_of(posixpath.dirname(paths[0]))
    written: list[str] = []

    def write(folder: str) -> list[str]:
        fs, path = filesystem_for(folder)
        fs.create_dir(path, recursive=True)
        for number, source in enumerate(paths):
            with lake.fs.open_input_file(source) as handle:
                parquet = pq.ParquetFile(handle)
                batches = (_with_batch(parquet.read_row_group(i), batch) for i in range(parquet.num_row_groups))
                target = f"{folder}/part-{number:05d}.parquet"
                write_parquet(
                    fs, f"{path}/part-{number:05d}.parquet", schema, (b for t in batches for b in t.to_batches()), BLOB_COLUMNS
                )
                written.append(target)
        return written

    rows = sum(pq.ParquetFile(lake.fs.open_input_file(p)).metadata.num_rows for p in paths)
    # The PNG files of ernie_generated_images stay where they are: the rows' png_path names them.
    snapshot_id = lake.tables.write_and_commit(name, schema, write, batch, properties={MIGRATED_FROM: old_folder})
    landed = lake.tables.snapshot(name, snapshot_id, batch).dataset().count_rows()
    if landed != rows:  # the old files stay: nothing is lost
        raise RuntimeError(f"{name}{f'[{batch}]' if batch else ''}: {landed} rows committed for {rows} in {old_folder}")
    log(f"{name}{f'[{batch}]' if batch else ''}: {rows} rows from {old_folder} -> snapshot {snapshot_id}")
    for source in paths:
        lake.fs.delete_file(source)


def _with_batch(table, batch: str | None):
    import pyarrow as pa

    if batch is None or PARTITION_COLUMN in table.column_names:
        return table
    return table.append_column(PARTITION_COLUMN, pa.array([batch] * table.num_rows, pa.string()))
