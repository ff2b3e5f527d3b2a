"""Reading back what raw_images wrote, for metadata, checks and downstream assets (driver side, pyiceberg scans)."""

from __future__ import annotations

from collections import Counter

from dgx_assets.ingest import images
from dgx_assets.lake.files import PARTITION_COLUMN
from dgx_assets.lake.store import Lake

TABLE = "raw_images"
SUMMARY_COLUMNS = ["path", "label", "size_bytes", "sha256", "format", "width", "height", "mode", "status", "reason", "split"]


def read_partition_summary(lake: Lake, batch: str, snapshot_id: int | None = None):
    """The batch's rows without the image bytes, as a pyarrow Table (None when it has none), from a snapshot
    (the current one by default)."""
    from pyiceberg.expressions import EqualTo

    table = lake.tables.scan(TABLE, SUMMARY_COLUMNS, EqualTo(PARTITION_COLUMN, batch), snapshot_id)  # pyright: ignore[reportCallIssue]
    return table if table is not None and table.num_rows else None


def summarize(table) -> dict:
    rows = table.to_pylist()
    statuses = Counter(row["status"] for row in rows)
    valid = [row for row in rows if row["status"] == images.VALID]
    return {
        "files_listed": len(rows),
        "valid": statuses.get(images.VALID, 0),
        "quarantined": {status: count for status, count in sorted(statuses.items()) if status != images.VALID},
        "bytes": sum(row["size_bytes"] or 0 for row in rows),
        "valid_bytes": sum(row["size_bytes"] or 0 for row in valid),
        "labels": dict(sorted(Counter(row["label"] for row in valid if row["label"] is not None).items())),
        "production_images": sum(1 for row in valid if row["label"] is None),
        "splits": dict(sorted(Counter(row["split"] for row in valid).items())),
    }
