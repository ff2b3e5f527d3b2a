"""The generated table's summary, streamed from a real snapshot's Parquet files (several files, several batches)."""

from __future__ import annotations

import pyarrow as pa
from support.lake_tables import commit_rows

from dgx_assets.generation import table
from dgx_assets.lake.store import Lake


def _rows(rows: list[tuple[str, bool, str | None, str | None]]) -> pa.Table:
    return pa.table(
        {
            "status": [r[0] for r in rows],
            "truncated": [r[1] for r in rows],
            "endpoint": pa.array([r[2] for r in rows], pa.string()),
            "error": pa.array([r[3] for r in rows], pa.string()),
            "content": pa.array([b"png"] * len(rows), pa.binary()),
        }
    )


def test_summary_counts_statuses_endpoints_and_truncation_across_files(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.write_bytes(lake.uri("ernie_generated_images", "png", "run", "x.png"), b"not a table")  # not part of the table
    first = _rows(
        [
            ("valid", False, "http://a", None),
            ("valid", True, "http://b", None),
            ("failed", False, "http://a", "connection refused"),
        ]
    )
    second = _rows(
        [("invalid_prompt", False, None, "empty prompt"), ("valid", False, "", None), ("corrupted", True, "http://b", "bad crc")]
    )
    commit_rows(lake.root, "ernie_generated_images", [first, second], row_group_size=2)  # row groups of 2: many batches
    dataset = table.written_dataset(lake)
    summary = table.summarize(dataset)
    assert summary == {
        "prompts": 6,
        "status_counts": {"valid": 3, "corrupted": 1, "failed": 1, "invalid_prompt": 1},
        "valid": 3,
        "sent": 5,
        "invalid_prompts": 1,
        "valid_share": 0.6,  # of the prompts that could be sent: the invalid one is judged by its own check
        "truncated": 2,
        "endpoints": {"http://a": 2, "http://b": 2},  # never-sent rows (no endpoint) are not counted
    }
    assert table.first_errors(dataset) == ["bad crc", "connection refused", "empty prompt"]


def test_no_table_gives_no_dataset(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    assert table.written_dataset(lake) is None
