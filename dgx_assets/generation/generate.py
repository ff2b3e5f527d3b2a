"""ernie_generated_images on Spark: executors call the serving endpoints, check every image, write PNGs.

The prompts are spread over a few tasks; each task's Python worker keeps one pooled client
(`client.get_client`) and runs `concurrency` requests at a time, so a few tasks keep several GPU servers
busy. Every returned image is decoded and classified `valid`, `corrupted` (recognised but damaged, or
not the size asked for) or `decode_error` (not an image at all); corrupted, undecodable and failed ones
are generated again, up to `max_attempts`. Every prompt ends in exactly one row with a final status.
PNG files are written by the executors as each batch completes, so the driver never holds the images.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import io
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from dgx_assets.generation.client import BAD_REPLY, ClientSettings, get_client

if TYPE_CHECKING:
    import pandas as pd

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


@dataclass(frozen=True)
class GenerationJob:
    """Everything an executor needs; pickled into the Spark tasks."""

    client: ClientSettings | None  # None when nothing is to be generated (only kept rows are rewritten)
    lake_root: str
    png_uri: str  # the folder the PNG files are written to (inside the staging folder)
    png_final_uri: str | None = None  # where that folder will be once committed: what png_path records
    max_attempts: int = 3
    default_width: int = 512
    default_height: int = 512
    tasks: int = 2  # Spark tasks the prompts are spread over


# --- plain functions ------------------------------------------------------------------------------------

def safe_file_name(prompt_id: str | None, request_key: str) -> str:
    """A file name that is safe on any filesystem whatever the id holds ('../../etc/passwd', '', 'a/b').

    Readable part from the id, plus a hash that keeps different ids (and different prompts under the
    same id) from ever sharing a file.
    """
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", prompt_id or "").strip("._-")[:60] or "prompt"
    digest = hashlib.sha256(f"{prompt_id}\x1f{request_key}".encode("utf-8", "replace")).hexdigest()[:12]
    return f"{readable}-{digest}.png"


def classify_image(payload_b64: str | None, width: int, height: int) -> tuple[str, bytes | None, str | None]:
    """(status, PNG bytes for valid images, reason) for one reply's image."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = base64.b64decode(payload_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        return DECODE_ERROR, None, "the reply's image is not valid base64"
    if not data:
        return DECODE_ERROR, None, "the reply's image is empty"
    try:
        image = Image.open(io.BytesIO(data))
        kind = image.format
    except UnidentifiedImageError:
        return DECODE_ERROR, None, f"not an image: {len(data)} bytes starting {data[:8].hex()}"
    except Exception as error:  # noqa: BLE001 - any decoder failure is a classification, not a crash
        return DECODE_ERROR, None, f"not an image: {type(error).__name__}: {error}"[:300]
    try:
        image.verify()  # chunk CRCs and structure
        with Image.open(io.BytesIO(data)) as decoded:
            decoded.load()  # every pixel: a truncated stream fails here
            size = decoded.size
            if kind != "PNG":  # the PNG files and the table hold PNG whatever the server sent
                buffer = io.BytesIO()
                decoded.save(buffer, format="PNG")
                data = buffer.getvalue()
    except Exception as error:  # noqa: BLE001
        return CORRUPTED, None, f"damaged {kind}: {type(error).__name__}: {error}"[:300]
    if size != (width, height):
        return CORRUPTED, None, f"image is {size[0]}x{size[1]}, asked for {width}x{height}"
    return VALID, data, None


def _integer(text, name: str, default: int | None) -> tuple[int | None, str | None]:
    """(value, problem) for a table cell that should hold an integer; blank means the default."""
    if text is None or str(text).strip() == "":
        return default, None
    match = re.fullmatch(r"\s*(-?\d{1,12})(?:\.0*)?\s*", str(text))
    if not match:
        return None, f"{name} {str(text)[:30]!r} is not an integer"
    return int(match.group(1)), None


# A prompt without an id is named after its request key, so it keeps its id from run to run.
DEFAULT_ID_PREFIX, DEFAULT_ID_KEY_CHARS = "row-", 12


def start_row(record: dict, job: GenerationJob, now: dt.datetime) -> dict:
    """An output row for one prompt, with its request parsed (or the reason it cannot be sent)."""
    key = record["request_key"]
    prompt_id = record.get("id") or f"{DEFAULT_ID_PREFIX}{key[:DEFAULT_ID_KEY_CHARS]}"
    width, width_problem = _integer(record.get("width"), "width", job.default_width)
    height, height_problem = _integer(record.get("height"), "height", job.default_height)
    seed, seed_problem = _integer(record.get("seed"), "seed", zlib.crc32(prompt_id.encode("utf-8", "replace")))
    prompt = record.get("prompt")
    problems = [p for p in (width_problem, height_problem, seed_problem) if p]
    if prompt is None or not prompt.strip():
        problems.insert(0, "the prompt is empty")
    for name, value in (("width", width), ("height", height)):
        if value is not None and value <= 0:
            problems.append(f"{name} must be positive, got {value}")
    if seed is not None and not 0 <= seed < 2**32:
        problems.append(f"seed must be 0..{2**32 - 1}, got {seed}")
    return {
        "id": prompt_id, "prompt": prompt, "label": record.get("label"), "width": width, "height": height,
        "seed": seed, "used_prompt": None, "truncated": None, "content": None,
        "file_name": safe_file_name(prompt_id, key), "png_path": None,
        "status": INVALID_PROMPT if problems else None, "error": "; ".join(problems) or None,
        "endpoint": None, "latency_s": None, "attempts": 0, "http_tries": 0, "request_key": key,
        "generated_at": now,
    }


def generate_rows(client, rows: list[dict], max_attempts: int) -> None:
    """Fill in `rows` (from `start_row`) by calling the service, regenerating bad results."""
    pending = [row for row in rows if row["status"] != INVALID_PROMPT]
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        replies = client.generate_many([(r["prompt"], r["width"], r["height"], r["seed"]) for r in pending])
        still = []
        for row, reply in zip(pending, replies):
            row["attempts"] = attempt
            row["http_tries"] += reply.tries
            row["endpoint"] = reply.endpoint or row["endpoint"]
            if reply.ok:
                status, content, reason = classify_image(reply.payload_b64, row["width"], row["height"])
                row.update(status=status, content=content, error=reason, latency_s=reply.latency_s,
                           truncated=reply.truncated, used_prompt=reply.used_prompt)
            else:
                status = {"rejected": REJECTED, BAD_REPLY: BAD_REPLY}.get(reply.error_kind, FAILED)
                row.update(status=status, error=reply.error, content=None)
            if row["status"] in REGENERATE:
                still.append(row)
        pending = still


_LAKES: dict = {}


def _lake(root: str):
    from dgx_assets.lake import Lake

    if root not in _LAKES:
        _LAKES[root] = Lake(root)
    return _LAKES[root]


def write_pngs(rows: list[dict], job: GenerationJob) -> None:
    lake = _lake(job.lake_root)
    for row in rows:
        if row["status"] == VALID and row["content"] is not None:
            lake.write_bytes(f"{job.png_uri.rstrip('/')}/{row['file_name']}", bytes(row["content"]))
            row["png_path"] = f"{(job.png_final_uri or job.png_uri).rstrip('/')}/{row['file_name']}"


# --- mapInPandas bodies -----------------------------------------------------------------------------------

def generate_batches(job: GenerationJob):
    """mapInPandas body for prompts to generate: one output row per input prompt."""

    def run(frames: Iterator["pd.DataFrame"]) -> Iterator["pd.DataFrame"]:
        import pandas as pd

        client = get_client(job.client)
        for frame in frames:
            now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
            rows = [start_row(record, job, now) for record in _records(frame)]
            generate_rows(client, rows, job.max_attempts)
            write_pngs(rows, job)
            yield pd.DataFrame(rows, columns=COLUMNS)

    return run


def rewrite_batches(job: GenerationJob):
    """mapInPandas body for rows kept from the previous run: their PNG files go into the new version."""

    def run(frames: Iterator["pd.DataFrame"]) -> Iterator["pd.DataFrame"]:
        import pandas as pd

        for frame in frames:
            rows = _records(frame)
            write_pngs(rows, job)
            yield pd.DataFrame(rows, columns=COLUMNS)

    return run


def _records(frame) -> list[dict]:
    # pandas gives NaN/NaT for missing values; the rows want None.
    return [{key: (None if _missing(value) else value) for key, value in record.items()}
            for record in frame.to_dict("records")]


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
    reusable = (previous.where(F.col("status") == VALID).where(F.col("content").isNotNull())
                .dropDuplicates(["request_key"]).drop("id", "prompt", "label"))
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


def build_generated_frame(prompts, job: GenerationJob, previous=None):
    """Everything in one: split the work against `previous`, generate what is needed, keep the rest."""
    todo, kept = split_work(prompts, previous)
    return generated_frame(todo, kept, job)


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
