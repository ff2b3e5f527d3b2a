"""The ernie_generated_images table: its statuses and columns, and the readers reporting and checks use.

Plain pyarrow over the written files: no Spark, no client, so the report and the checks can read the table
without loading the Spark-side generation code.
"""

from __future__ import annotations

from dgx_assets.generation.client import BAD_REPLY

VALID = "valid"
CORRUPTED = "corrupted"
DECODE_ERROR = "decode_error"
FAILED = "failed"  # the service could not be reached or kept failing
REJECTED = "rejected"  # the service refused the request (4xx / err_no 5xxx): retrying will not help
# BAD_REPLY (client): the service answered, but not in the protocol's shape (wrong JSON types, missing fields)
INVALID_PROMPT = "invalid_prompt"  # the prompts table row itself is unusable; never sent
STATUSES = (VALID, CORRUPTED, DECODE_ERROR, FAILED, BAD_REPLY, REJECTED, INVALID_PROMPT)
REGENERATE = {CORRUPTED, DECODE_ERROR, FAILED, BAD_REPLY}

GENERATED_SCHEMA = (
    "id string, prompt string, label string, width int, height int, seed long, used_prompt string, "
    "truncated boolean, content binary, file_name string, png_path string, status string, error string, "
    "endpoint string, latency_s double, attempts int, http_tries int, request_key string, generated_at timestamp"
)
COLUMNS = [part.strip().split(" ")[0] for part in GENERATED_SCHEMA.split(",")]


def table_files(lake, uri: str) -> list[str]:
    """The table's Parquet files: Spark writes them at the folder's top, next to the `png/` folder, whose
    files are not listed (at 100,000 images that listing alone grew the driver by 80 MB)."""
    return lake.data_files(uri, recursive=False)


def spark_table(session, lake, uri: str):
    """The table as a Spark DataFrame, read from its files by name: reading the folder would make Spark list
    the 100,000 PNGs in `png/`, and a `*.parquet` glob makes it log a stack trace looking for metadata."""
    return session.read.parquet(*[lake.uri_of(path) for path in table_files(lake, uri)])


def written_dataset(lake, uri: str):
    """The written table as a pyarrow dataset (nothing read yet), or None when there is none."""
    import pyarrow.dataset as ds

    files = table_files(lake, uri)
    return ds.dataset(files, filesystem=lake.fs, format="parquet") if files else None


def summarize(dataset) -> dict:
    """Counts per status and endpoint, streamed over three small columns: the driver's memory stays flat
    however many images the table holds."""
    import pyarrow.compute as pc

    statuses: dict[str, int] = {}
    endpoints: dict[str, int] = {}
    total = truncated = 0
    for batch in dataset.to_batches(columns=["status", "truncated", "endpoint"]):
        total += batch.num_rows
        truncated += pc.sum(batch.column("truncated")).as_py() or 0
        for counts, column in ((statuses, "status"), (endpoints, "endpoint")):
            for entry in pc.value_counts(batch.column(column)).to_pylist():
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
