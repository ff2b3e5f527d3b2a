"""Hand-made table versions committed the way the assets commit theirs: Parquet files written into a new folder
of the table, then one Iceberg transaction (dgx_assets.lake.tables.LakeTables.write_and_commit)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from dgx_assets.lake.files import filesystem_for
from dgx_assets.lake.store import Lake


def commit_rows(
    lake_root: Path | str,
    name: str,
    table: pa.Table | list[pa.Table],
    batch: str | None = None,
    row_group_size: int | None = None,
) -> int:
    """Commit `table` (a list: one file each) as the new version of `name` (of its `batch`); returns the snapshot id."""
    import pyarrow.parquet as pq

    parts = table if isinstance(table, list) else [table]

    def write(folder: str) -> list[str]:
        fs, path = filesystem_for(folder)
        fs.create_dir(path, recursive=True)
        for number, part in enumerate(parts):
            with fs.open_output_stream(f"{path}/part-{number:05d}.parquet") as out:
                pq.write_table(part, out, row_group_size=row_group_size)
        return [f"{folder}/part-{number:05d}.parquet" for number in range(len(parts))]

    return Lake(str(lake_root)).tables.write_and_commit(name, parts[0].schema, write, batch)


def read_rows(lake_root: Path | str, name: str, batch: str | None = None, snapshot_id: int | None = None) -> list[dict]:
    """The rows of a table's snapshot (the current one by default), of one batch or all, through pyiceberg."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo

    row_filter = EqualTo("batch", batch) if batch is not None else AlwaysTrue()
    table = Lake(str(lake_root)).tables.scan(name, row_filter=row_filter, snapshot_id=snapshot_id)
    return [] if table is None else table.to_pylist()
