"""The ernie_generated_images table: its statuses and columns, and the readers reporting and checks use.

Plain pyarrow over a snapshot's data files: no Spark, no client, so the report and the checks can read the
table without loading the Spark-side generation code.
"""

from __future__ import annotations

from typing import cast

from dgx_assets.generation.replies import BAD_REPLY

VALID = "valid"
CORRUPTED = "corrupted"
DECODE_ERROR = "decode_error"
FAILED = "failed"  # the service could not be reached or kept failing
REJECTED = "rejected"  # the service refused the request (4xx / err_no 5xxx): retrying will not help
# BAD_REPLY (replies): the service answered, but not in the protocol's shape (wrong JSON types, missing fields)
INVALID_PROMPT = "invalid_prompt"  # the prompts table row itself is unusable; never sent
STATUSES = (VALID, CORRUPTED, DECODE_ERROR, FAILED, BAD_REPLY, REJECTED, INVALID_PROMPT)
REGENERATE = {CORRUPTED, DECODE_ERROR, FAILED, BAD_REPLY}

GENERATED_SCHEMA = (
    "id string, prompt string, label string, width int, height int, seed long, used_prompt string, "
    "truncated boolean, content binary, file_name string, png_path string, status string, error string, "
    "endpoint string, latency_s double, attempts int, http_tries int, request_key string, generated_at timestamp"
)
COLUMNS = [part.strip().split(" ")[0] for part in GENERATED_SCHEMA.split(",")]
TABLE = "ernie_generated_images"


def png_folder(lake) -> str:
    """A new folder for one run's PNG files, `<lake>/ernie_generated_images/png/<time>-<token>`: the snapshot
    that commits the run's rows names it (`catalog.FILES_FOLDER`), and lake maintenance deletes the folders no
    kept snapshot names."""
    import datetime as dt
    import uuid

    return lake.uri(TABLE, "png", f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}")


def arrow_schema():
    """The table's columns as Arrow types (what the executors write)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    columns = cast(StructType, _parse_datatype_string(GENERATED_SCHEMA))  # a DDL column list parses to a StructType
    return to_arrow_schema(columns, timezone="UTC")


def written_dataset(lake, snapshot_id: int | None = None):
    """A snapshot of the table (the current one by default) as a pyarrow dataset (nothing read yet), or None when
    the table has none."""
    snapshot = lake.tables.snapshot(TABLE, snapshot_id)
    return snapshot.dataset() if snapshot.uris else None


def summarize(dataset) -> dict:
    """Counts per status and endpoint, streamed over three small columns: the driver's memory stays flat
    however many images the table holds."""
    import pyarrow.compute as pc

    statuses: dict[str, int] = {}
    endpoints: dict[str, int] = {}
    total = truncated = 0
    for batch in dataset.to_batches(columns=["status", "truncated", "endpoint"]):
        total += batch.num_rows
        truncated += pc.sum(batch.column("truncated")).as_py() or 0  # pyright: ignore[reportAttributeAccessIssue]
        for counts, column in ((statuses, "status"), (endpoints, "endpoint")):
            for entry in pc.value_counts(batch.column(column)).to_pylist():  # pyright: ignore[reportAttributeAccessIssue]
                if entry["values"]:  # nulls and empty endpoints (rows never sent) are not counted
                    counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    counts = {status: statuses[status] for status in STATUSES if status in statuses}
    # Images are judged against the prompts that could be sent: a bad prompts-table row is its own problem.
    sent = total - counts.get(INVALID_PROMPT, 0)
    return {
        "prompts": total,
        "status_counts": counts,
        "valid": counts.get(VALID, 0),
        "sent": sent,
        "invalid_prompts": counts.get(INVALID_PROMPT, 0),
        "valid_share": counts.get(VALID, 0) / sent if sent else 0.0,
        "truncated": truncated,
        "endpoints": endpoints,
    }


def first_errors(dataset, limit: int = 3) -> list[str]:
    """A few distinct error messages, for a failure's description."""
    errors: set[str] = set()
    for batch in dataset.to_batches(columns=["error"]):
        errors.update(e for e in batch.column("error").drop_null().unique().to_pylist() if e)
        if len(errors) >= limit:
            break
    return sorted(errors)[:limit]
