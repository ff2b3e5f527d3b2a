"""The raw_images Spark job: list a landing batch once, read and decode every file on the executors, write Parquet.

The driver lists the batch through the lake's filesystem layer (local, hdfs://, webhdfs://) and cuts the
listing into chunks of about `target_file_bytes`, one partition and so about one Parquet file each:
millions of small images become few large files, as HDFS needs. Each task's Python worker reads its
chunk's files itself (`dgx_assets.spark.chunks`), so the JVM never opens an image and the bytes cross into
it once, on their way to Parquet, as Arrow batches (no pandas). Spark's `binaryFile` source would list the
batch again in the JVM and stat every file in its task (measured: more JVM CPU than writing the Parquet),
and with the content it sends every image's bytes to Python and back.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import os
import posixpath
import stat
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from dgx_assets.ingest import images
from dgx_assets.lake.files import batch_name, worker_filesystem
from dgx_assets.spark.chunks import map_chunks, pack

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from dgx_assets.ingest.landing import LandedBatch

_TIMESTAMP = pa.timestamp("us", tz="UTC")  # Spark's TimestampType
RAW_IMAGES_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("batch", pa.string()),
        ("label", pa.string()),
        ("size_bytes", pa.int64()),
        ("modified_at", _TIMESTAMP),
        ("sha256", pa.string()),
        ("format", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("mode", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("split", pa.string()),
        ("content", pa.binary()),
        ("ingested_at", _TIMESTAMP),
    ]
)
# `batch` is stored in the files: the Iceberg table is partitioned by it, and takes a file's partition from its values.

# Parquet codec for the raw_images files. Nearly all of their bytes are PNG/JPEG content, already
# compressed: zstd (the session default) saved 0% on PNG and ~3% on JPEG here, for ~0.5 JVM CPU-s per
# 180 MB. Uncompressed Parquet is read by pyarrow and Spark alike.
PARQUET_COMPRESSION = "none"

ROWS_PER_ARROW_BATCH = 256  # rows a worker holds before handing them to the JVM (the profile's maxRecordsPerBatch)
OPEN_COST_BYTES = 64 * 1024  # what opening one file is counted as when chunks are balanced


class ListedFile(NamedTuple):
    path: str  # as Spark spells it: `file:/x`, `hdfs://nn:8020/x`
    size: int
    modified_us: int | None  # microseconds since the epoch, milliseconds precision like Hadoop's FileStatus
    status: str | None = None  # set for an entry the listing refused (link, special file, unlistable folder)
    reason: str | None = None


# --- driver ---------------------------------------------------------------------------------------------


def list_batch(batch_uri: str, landed: LandedBatch | None = None) -> list[ListedFile]:
    """Every image file of a landing batch, zero-byte ones included, and every entry the listing refused
    (links, special files, unlistable folders: they get a row, never a read), sorted by path.

    Hidden and `_`-prefixed files and folders are skipped (as Spark and the landing sensor skip them), and
    so is any file without an image extension: `x.png._COPYING_` is still being written. `landed` is the
    batch's listing when the caller has it already (`landing.look_at_batch`).
    """

    from dgx_assets.ingest.landing import look_at_batch

    landed = landed or look_at_batch(batch_uri)
    prefix = _prefix(batch_uri)
    found = [
        ListedFile(prefix + path, size, mtime_ns // 1_000_000 * 1000)
        for path, size, mtime_ns in landed.listing.files
        if posixpath.splitext(path)[1].lstrip(".").lower() in images.IMAGE_EXTENSIONS
    ]
    found += [ListedFile(prefix + entry.path, 0, None, entry.status, entry.reason) for entry in landed.listing.refused]
    return sorted(found, key=lambda file: file.path)


def _prefix(batch_uri: str) -> str:
    from urllib.parse import urlparse

    from dgx_assets.lake.files import normalize_uri

    uri = urlparse(normalize_uri(batch_uri.rpartition("/")[0] or batch_uri))  # the zone's: the batch's name is data
    # Spark names local files `file:/path`; keep its spelling, which the table has always had.
    return "file:" if uri.scheme == "file" else f"{uri.scheme}://{uri.netloc}"


def build_raw_images(spark, batch_uri: str, settings: images.IngestSettings, landed: LandedBatch | None = None):
    """The raw_images DataFrame for one landing batch folder, or None when it holds no image files.

    Lazy: the files are listed now, read when the DataFrame is written.
    """
    from dgx_assets.ingest.landing import look_at_batch

    landed = landed or look_at_batch(batch_uri)
    files = list_batch(batch_uri, landed)
    if not files:
        return None
    chunks = pack(files, _weight, settings.target_file_bytes, spark.sparkContext.defaultParallelism)
    # The folder as it is spelt on disk (labels are the folders under it), the batch by its name (NFC).
    ingest = functools.partial(
        ingest_files, batch_path=_prefix(batch_uri) + landed.path, settings=settings, batch_key=landed.state.name
    )
    return map_chunks(spark, chunks, ingest, RAW_IMAGES_SCHEMA)


def write_raw_images(frame, folder_uri: str, writer: str = "arrow") -> list[str]:
    """Write a raw_images DataFrame as Parquet files into a new folder; returns the files, for the table's commit."""
    from dgx_assets.spark.table_writer import write_table_files

    return write_table_files(frame, folder_uri, RAW_IMAGES_SCHEMA, ("content",), PARQUET_COMPRESSION, writer)


def _weight(file: ListedFile) -> int:
    return file.size + OPEN_COST_BYTES


# --- Python workers -------------------------------------------------------------------------------------


def ingest_files(
    files: list[ListedFile], batch_path: str, settings: images.IngestSettings, batch_key: str | None = None
) -> Iterator[pa.RecordBatch]:
    """One raw_images row per listed file, in Arrow batches of ROWS_PER_ARROW_BATCH rows. `batch_key` (the
    folder's name in NFC by default) goes into the `batch` column."""
    fs = worker_filesystem(batch_path)
    batch_key = batch_key if batch_key is not None else batch_name(posixpath.basename(batch_path.rstrip("/")))
    ingested_at = dt.datetime.now(dt.UTC)
    for start in range(0, len(files), ROWS_PER_ARROW_BATCH):
        listed = files[start : start + ROWS_PER_ARROW_BATCH]
        rows = [file_row(fs, file, batch_path, settings) for file in listed]
        columns = {name: [row.get(name) for row in rows] for name in RAW_IMAGES_SCHEMA.names}
        columns["batch"] = [batch_key] * len(rows)
        columns["modified_at"] = [file.modified_us for file in listed]
        columns["ingested_at"] = [ingested_at] * len(rows)
        yield pa.RecordBatch.from_pydict(columns, schema=RAW_IMAGES_SCHEMA)


def file_row(fs: pafs.FileSystem, file: ListedFile, batch_path: str, settings: images.IngestSettings) -> dict:
    """The raw_images columns one listed entry decides; content kept only for valid images.

    Never raises for a bad file: every one gets a status and a reason.
    """
    path, size = file.path, file.size
    row = {"path": path, "label": images.label_from_path(path, batch_path)}
    if file.status is not None:  # refused by the listing: a link, a special file, an unlistable folder
        return row | {"status": file.status, "reason": file.reason}
    row["size_bytes"] = size
    limit = settings.max_file_bytes
    if size > limit:  # decided from the listing: the content is never read
        return row | {"status": images.TOO_LARGE, "reason": f"{size} bytes is over the {limit}-byte limit; content not read"}
    try:
        data = _read(fs, path)
    except _NotARegularFile as refused:
        return row | {"status": refused.status, "reason": f"{refused.reason} (a regular file when it was listed)"}
    except (FileNotFoundError, PermissionError) as error:
        # Gone or forbidden since it was listed: recorded, not fatal. Other I/O errors fail the task, so
        # Spark retries it.
        return row | {"status": images.UNREADABLE, "reason": f"could not read the file: {type(error).__name__}: {error}"}
    verdict = images.inspect_image(data, path, settings)
    digest = images.sha256_hex(data)
    return (
        row
        | verdict.as_dict()
        | {
            "sha256": digest,
            "split": images.split_of(digest, row["label"], settings),
            "content": data if verdict.status == images.VALID else None,
        }
    )


class _NotARegularFile(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    import pyarrow.fs as pafs

    inside = images.path_inside(path)
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_input_file(inside) as handle:
            return handle.read()
    # A local file may have become a link or a FIFO since it was listed: O_NOFOLLOW refuses the link,
    # O_NONBLOCK keeps a FIFO from blocking the open, and fstat tells what was really opened.
    try:
        descriptor = os.open(inside, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _NotARegularFile(images.SYMLINK, "a symbolic link: not followed") from None
        raise
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _NotARegularFile(images.SPECIAL_FILE, "a special file: never read")
        return handle.read()
