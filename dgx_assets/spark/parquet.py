"""Parquet writer settings for the lake's tables that carry image bytes (raw_images' content, image_features'
tensors, ernie_generated_images' PNGs).

Row groups of 16 MB, not Parquet's 128 MB: every row carries an image, each writing task buffers a whole
row group in the JVM, and readers split their work by row group (image_features' tasks, training's
streaming reads), so smaller groups also balance over more cores.

A column of opaque bytes gains nothing from a dictionary (no two values repeat) or from min/max statistics
(no query filters on image bytes), and Parquet pays for both per value: hashing values for the dictionary
until it overflows, comparing and copying them for the statistics. Turning both off for the image column
cut the JVM's CPU on bench/ingest.py's 5,000 images by about an eighth (BENCHMARKS.md, 1).
"""

from __future__ import annotations

ROW_GROUP_BYTES = 16 * 1024 * 1024


def image_table_options(*blob_columns: str, compression: str | None = None) -> dict[str, str]:
    """DataFrameWriter options for a table whose `blob_columns` hold image bytes; `compression` overrides
    the session's codec (raw_images stores already-compressed PNG and JPEG uncompressed)."""
    options = {"parquet.block.size": str(ROW_GROUP_BYTES)}
    if compression:
        options["compression"] = compression
    for column in blob_columns:
        options[f"parquet.enable.dictionary#{column}"] = "false"
        options[f"parquet.column.statistics.enabled#{column}"] = "false"
        options[f"parquet.size.statistics.enabled#{column}"] = "false"
    return options
