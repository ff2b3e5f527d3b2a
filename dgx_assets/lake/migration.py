"""Converting the tables of the folder layout of before Iceberg (`dgx-assets lake migrate`).

`migrate` converts `<lake>/<table>/batch=<key>/*.parquet` batch by batch: each batch's rows are read once,
written with their `batch` column into the table's data location and committed as that batch's version; only then
are the converted files deleted. Run again after an interruption, it redoes the batches still in the old layout (a
commit replaces the batch, so no row is counted twice). It never follows a link, and what it does not convert
(other files and folders, hidden ones, links) stays where it is, listed in its output.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dgx_assets.lake.files import filesystem_for, has_hidden_part
from dgx_assets.lake.listing import Entry, delete_entry, entries, lstat_entry
from dgx_assets.lake.maintenance import PNG_FOLDER
from dgx_assets.lake.tables import PARTITION_COLUMN, TABLES, UNPARTITIONED_TABLES

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake

MIGRATED_FROM = "dgx.migrated-from"  # snapshot property: the folder a migrated batch came from
BLOB_COLUMNS = ("content", "tensor")  # image columns: no dictionary, no statistics (spark/parquet.py)


class MigrationRefused(RuntimeError):
    """The migration found a layout it cannot read; the message says what to move away."""


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
    top = lstat_entry(lake.uri(name))
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
    entry = lstat_entry(folder)
    if entry is not None and entry.kind == "dir" and next(entries(folder), None) is None:
        delete_entry(entry)


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
        entry = lstat_entry(source)
        if entry is not None and entry.kind == "file":
            delete_entry(entry)


def _with_batch(table, batch: str | None):
    import pyarrow as pa

    if batch is None or PARTITION_COLUMN in table.column_names:
        return table
    return table.append_column(PARTITION_COLUMN, pa.array([batch] * table.num_rows, pa.string()))
