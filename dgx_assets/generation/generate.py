"""ernie_generated_images on Spark: executors call the serving endpoints, check every image, write PNGs.

The prompts are spread over a few tasks; each task's Python worker keeps one pooled client
(`client.get_client`) and runs `concurrency` requests at a time, so a few tasks keep several GPU servers
busy. Every returned image is decoded and classified `valid`, `corrupted` (recognised but damaged, or
not the size asked for) or `decode_error` (not an image at all); corrupted, undecodable and failed ones
are generated again, up to `max_attempts`. Every prompt ends in exactly one row with a final status.
PNG files are written by the executors as each batch completes, so the driver never holds the images.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dgx_assets.generation.client import get_client
from dgx_assets.generation.client_settings import ClientSettings
from dgx_assets.generation.rows import DEFAULT_ID_KEY_CHARS, DEFAULT_ID_PREFIX, generate_rows, start_row
from dgx_assets.generation.table import COLUMNS, GENERATED_SCHEMA, VALID

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class GenerationJob:
    """Everything an executor needs; pickled into the Spark tasks."""

    client: ClientSettings | None  # None when nothing is to be generated (only kept rows are rewritten)
    lake_root: str
    png_uri: str  # this run's PNG folder (table.png_folder), named by the snapshot that commits the rows
    max_attempts: int = 3
    default_width: int = 512
    default_height: int = 512
    tasks: int = 2  # Spark tasks the prompts are spread over


# --- executor side -------------------------------------------------------------------------------------

# One Lake per Python worker and lake root: Spark reuses workers across tasks.
_LAKES: dict = {}


def _lake(root: str):
    from dgx_assets.lake.store import Lake

    if root not in _LAKES:
        _LAKES[root] = Lake(root)
    return _LAKES[root]


def write_pngs(rows: list[dict], job: GenerationJob) -> None:
    lake = _lake(job.lake_root)
    for row in rows:
        if row["status"] == VALID and row["content"] is not None:
            lake.write_bytes(f"{job.png_uri.rstrip('/')}/{row['file_name']}", bytes(row["content"]))
            row["png_path"] = f"{job.png_uri.rstrip('/')}/{row['file_name']}"


# --- mapInPandas bodies -----------------------------------------------------------------------------------


def generate_batches(job: GenerationJob):
    """mapInPandas body for prompts to generate: one output row per input prompt."""
    client_settings = job.client
    if client_settings is None:
        raise ValueError("prompts to generate, but the GenerationJob has no client settings (no serving endpoints)")

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        client = get_client(client_settings)
        for frame in frames:
            now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            rows = [start_row(record, job, now) for record in _records(frame)]
            generate_rows(client, rows, job.max_attempts)
            write_pngs(rows, job)
            yield pd.DataFrame(rows, columns=COLUMNS)  # pyright: ignore[reportArgumentType]

    return run


def rewrite_batches(job: GenerationJob):
    """mapInPandas body for rows kept from the previous run: their PNG files go into the new version."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        for frame in frames:
            rows = _records(frame)
            write_pngs(rows, job)
            yield pd.DataFrame(rows, columns=COLUMNS)  # pyright: ignore[reportArgumentType]

    return run


def _records(frame) -> list[dict]:
    # pandas gives NaN/NaT for missing values; the rows want None.
    return [{key: (None if _missing(value) else value) for key, value in record.items()} for record in frame.to_dict("records")]


def _missing(value) -> bool:
    try:
        return value is None or (value != value)  # NaN and NaT are not equal to themselves
    except (TypeError, ValueError):
        return False


# --- the Spark job ------------------------------------------------------------------------------------------


def with_request_key(prompts):
    """Add `request_key`: a hash of what decides the image (id, prompt, size, seed), to find reusable rows."""
    from pyspark.sql import functions as F

    parts = [F.coalesce(F.col(name), F.lit("")) for name in ("id", "prompt", "width", "height", "seed")]
    return prompts.withColumn("request_key", F.sha2(F.concat_ws("\u001f", *parts), 256))


def split_work(prompts, previous=None):
    """(prompts to generate, rows to keep) as lazy DataFrames.

    `prompts`: id, prompt, width, height, seed, label as strings (see prompts.read_prompts). `previous`:
    the last version of the table, or None; its valid rows whose prompt, size and seed are unchanged are
    kept as they are (second element, in the table's columns) instead of being generated again.
    """
    from pyspark.sql import functions as F

    keyed = with_request_key(prompts)
    if previous is None or not set(COLUMNS) <= set(previous.columns):
        return keyed, None
    reusable = (
        previous.where(F.col("status") == VALID)
        .where(F.col("content").isNotNull())
        .dropDuplicates(["request_key"])
        .drop("id", "prompt", "label")
    )
    # The id as start_row gives it: a prompt without one keeps the id its first run made from its request key.
    default_id = F.concat(F.lit(DEFAULT_ID_PREFIX), F.substring("request_key", 1, DEFAULT_ID_KEY_CHARS))
    ids = F.when(F.coalesce(F.col("id"), F.lit("")) == "", default_id).otherwise(F.col("id")).alias("id")
    kept = keyed.select("request_key", ids, "prompt", "label").join(reusable, "request_key", "inner")
    todo = keyed.join(reusable.select("request_key"), "request_key", "left_anti")
    return todo, kept.select(*COLUMNS)


def generated_frame(todo, kept, job: GenerationJob):
    """The lazy DataFrame of table rows; the PNG files are written while it runs. Either input may be None."""
    parts = []
    if todo is not None:
        parts.append(todo.repartition(max(1, job.tasks)).mapInPandas(generate_batches(job), GENERATED_SCHEMA))
    if kept is not None:
        parts.append(kept.mapInPandas(rewrite_batches(job), GENERATED_SCHEMA))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    return frame
