"""Reading back what raw_images wrote, for metadata, checks and downstream assets (driver side, pyarrow)."""

from __future__ import annotations

from collections import Counter

import pyarrow.dataset as ds

from dgx_assets.ingest import images
from dgx_assets.lake import Lake

SUMMARY_COLUMNS = ["path", "label", "size_bytes", "sha256", "format", "width", "height", "mode", "status", "reason", "split"]


def dataset(lake: Lake, partition_uri: str) -> ds.Dataset:
    return ds.dataset(lake.data_files(partition_uri), filesystem=lake.fs, format="parquet")


def read_partition_summary(lake: Lake, partition_uri: str):
    """The partition's rows without the image bytes, as a pyarrow Table."""
    if not lake.data_files(partition_uri):
        return None
    return dataset(lake, partition_uri).to_table(columns=SUMMARY_COLUMNS)


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
        "labels": dict(sorted(Counter(row["label"] or "(none)" for row in valid).items())),
        "splits": dict(sorted(Counter(row["split"] for row in valid).items())),
    }
