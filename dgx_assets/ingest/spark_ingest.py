"""The raw_images Spark job: list a landing batch, decode every file on the executors, write Parquet.

Spark's `binaryFile` source lists the batch and pushes the size filter down, so files over the byte limit
are recorded without their content ever being read. Files are packed into read partitions of about
`target_file_bytes`, which is also about the size of each Parquet file written: millions of small images
become few large files, as HDFS needs.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from dgx_assets.ingest import images

if TYPE_CHECKING:
    import pandas as pd  # executors import it when they run; the driver need not

RAW_IMAGES_SCHEMA = (
    "path string, label string, size_bytes long, modified_at timestamp, sha256 string, format string, "
    "width int, height int, mode string, status string, reason string, split string, content binary, "
    "ingested_at timestamp"
)
# `batch` is not stored in the files: it is the hive folder `batch=<key>` and comes back when the table is read.

_GLOB = "*.{" + ",".join(ext for e in images.IMAGE_EXTENSIONS for ext in (e, e.upper())) + "}"


@dataclass
class IngestSettings:
    limits: images.ValidationLimits = field(default_factory=images.ValidationLimits)
    validation_share: float = 0.15
    test_share: float = 0.15
    target_file_bytes: int = 128 * 1024 * 1024


def classify_files(
    frames: Iterator["pd.DataFrame"], batch_path: str, settings: IngestSettings
) -> Iterator["pd.DataFrame"]:
    """mapInPandas body: one output row per input file, content kept only for valid images."""
    import pandas as pd

    ingested_at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    for frame in frames:
        rows = []
        for path, length, modified, content in zip(
            frame["path"], frame["length"], frame["modificationTime"], frame["content"]
        ):
            label = images.label_from_path(path, batch_path)
            data = bytes(content) if content is not None else b""
            verdict = images.inspect_image(data, path, settings.limits)
            if verdict.status == images.VALID and label is None:
                verdict.status, verdict.reason = images.UNLABELLED, "the file is not inside a label folder"
            digest = images.sha256_hex(data)
            rows.append(
                {
                    "path": path,
                    "label": label,
                    "size_bytes": int(length),
                    "modified_at": modified,
                    "sha256": digest,
                    **verdict.as_dict(),
                    "split": images.split_for(digest, settings.validation_share, settings.test_share),
                    "content": data if verdict.status == images.VALID else None,
                    "ingested_at": ingested_at,
                }
            )
        yield pd.DataFrame(rows, columns=[c.split()[0] for c in RAW_IMAGES_SCHEMA.split(", ")])


def oversized_rows(frames: Iterator["pd.DataFrame"], batch_path: str, settings: IngestSettings):
    """mapInPandas body for files over the byte limit: recorded from the listing, content never read."""
    import pandas as pd

    ingested_at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    limit = settings.limits.max_file_bytes
    for frame in frames:
        yield pd.DataFrame(
            {
                "path": frame["path"],
                "label": [images.label_from_path(p, batch_path) for p in frame["path"]],
                "size_bytes": frame["length"].astype("int64"),
                "modified_at": frame["modificationTime"],
                "sha256": None,
                "format": None,
                "width": None,
                "height": None,
                "mode": None,
                "status": images.TOO_LARGE,
                "reason": [f"{n} bytes is over the {limit}-byte limit; content not read" for n in frame["length"]],
                "split": None,
                "content": None,
                "ingested_at": ingested_at,
            }
        )


def empty_files(batch_uri: str) -> list[tuple[str, "dt.datetime"]]:
    """Zero-byte image files in a batch, listed on the driver: Spark's file scan drops empty files silently."""
    import posixpath
    from urllib.parse import urlparse

    import pyarrow.fs as pafs

    from dgx_assets.lake import filesystem_for, normalize_uri

    fs, root = filesystem_for(batch_uri)
    uri = urlparse(normalize_uri(batch_uri))
    # Spark names local files `file:/path`; keep the same spelling so every row's path looks alike.
    prefix = "file:" if uri.scheme == "file" else f"{uri.scheme}://{uri.netloc}"
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        relative = info.path[len(root):].lstrip("/")
        if info.type != pafs.FileType.File or info.size != 0:
            continue
        if any(part.startswith((".", "_")) for part in relative.split("/")):
            continue
        if posixpath.splitext(info.path)[1].lstrip(".").lower() in images.IMAGE_EXTENSIONS:
            found.append((prefix + info.path, info.mtime.replace(tzinfo=None) if info.mtime else None))
    return found


def build_raw_images(spark, batch_uri: str, settings: IngestSettings):
    """The raw_images DataFrame for one landing batch folder (lazy: nothing runs until it is written)."""
    from pyspark.sql import functions as F

    # Pack many small files into each read partition (the default open cost of 4 MB per file would
    # give a partition, and so an output file, per ~30 images).
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(settings.target_file_bytes))
    spark.conf.set("spark.sql.files.openCostInBytes", str(64 * 1024))
    listing = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", _GLOB)
        .option("recursiveFileLookup", "true")
        .option("ignoreMissingFiles", "true")
        .load(batch_uri)
    )
    limit = settings.limits.max_file_bytes
    fits = listing.filter(F.col("length") <= limit).mapInPandas(
        lambda frames: classify_files(frames, batch_uri, settings), RAW_IMAGES_SCHEMA
    )
    too_big = (
        listing.filter(F.col("length") > limit)
        .select("path", "length", "modificationTime", F.lit(None).cast("binary").alias("content"))
        .mapInPandas(lambda frames: oversized_rows(frames, batch_uri, settings), RAW_IMAGES_SCHEMA)
    )
    frame = fits.unionByName(too_big)
    empty = empty_files(batch_uri)
    if empty:
        listed = spark.createDataFrame(
            [(path, 0, modified, bytearray()) for path, modified in empty],
            "path string, length long, modificationTime timestamp, content binary",
        )
        frame = frame.unionByName(listed.mapInPandas(lambda frames: classify_files(frames, batch_uri, settings), RAW_IMAGES_SCHEMA))
    return frame
