"""The prompts table: the demo file the project seeds, and reading a user's table with Spark.

Columns: `id`, `prompt` (required); `width`, `height`, `seed`, `label` (optional). CSV (RFC 4180 quoting:
a quote inside a field is doubled, fields may span lines) or Parquet.
"""

from __future__ import annotations

import csv
import io
import posixpath

from dgx_assets.lake.files import filesystem_for

COLUMNS = ("id", "prompt", "width", "height", "seed", "label")

# Rare defects inspection teams cannot photograph often enough, in English and Chinese.
DEMO_PROMPTS = [
    ("crack-mono-en", "Electroluminescence image of a defective mono solar cell with a diagonal crack", "defective"),
    ("crack-mono-zh", "单晶硅太阳能电池片的电致发光图像，有对角裂纹缺陷", "defective"),
    ("broken-poly-en", "EL image of a broken poly-crystalline cell, dark inactive region near the busbar", "defective"),
    ("broken-poly-zh", "多晶电池片电致发光图像：母线附近有破损和暗区", "defective"),
    ("finger-mono-en", 'A "cracked" mono cell: finger interruptions, micro-cracks, faulty', "defective"),
    ("finger-poly-zh", "有缺陷的多晶硅电池片，“断栅”和微裂纹", "defective"),
    ("slight-mono-en", "Slightly defective mono cell, possibly a small crack at the corner", "defective"),
    ("slight-poly-zh", "轻微缺陷的多晶电池片，边角可能有小裂纹", "defective"),
    ("good-mono-en", "Functional mono-crystalline solar cell, intact, uniform electroluminescence", "functional"),
    ("good-mono-zh", "正常的单晶硅太阳能电池片，完好无缺陷", "functional"),
    ("good-poly-en", "Intact, healthy poly cell; no cracks, no dark areas", "functional"),
    ("good-poly-zh", "完好的多晶硅电池片，发光均匀，合格", "functional"),
]


def demo_rows(width: int = 512, height: int = 512) -> list[dict]:
    return [
        {"id": pid, "prompt": prompt, "width": width, "height": height, "seed": 1000 + index, "label": label}
        for index, (pid, prompt, label) in enumerate(DEMO_PROMPTS)
    ]


def write_demo_prompts(uri: str, width: int = 512, height: int = 512) -> str:
    """Write the bilingual demo prompts CSV (UTF-8) to `uri` (plain path, file://, hdfs://) and return it."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(demo_rows(width, height))
    fs, path = filesystem_for(uri)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(buffer.getvalue().encode("utf-8"))
    return uri


def read_prompts(spark, uri: str):
    """The prompts as a Spark DataFrame with every column as a string (parsing is the executors' job, so
    a bad width becomes a row with a reason instead of a silent null)."""
    from pyspark.sql import functions as F

    if uri.rstrip("/").lower().endswith(".parquet"):
        frame = spark.read.parquet(uri)
    else:
        frame = (
            spark.read.option("header", True)
            .option("multiLine", True)
            .option("escape", '"')
            .option("encoding", "UTF-8")
            .option("mode", "PERMISSIVE")
            .csv(uri)
        )
    columns = {name.strip().lower(): name for name in frame.columns}
    missing = [name for name in ("id", "prompt") if name not in columns]
    if missing:
        raise ValueError(
            f"prompts table {uri} lacks column(s) {', '.join(missing)}; it has {sorted(columns)}. "
            f"Expected {', '.join(COLUMNS)} (width, height, seed, label optional)."
        )
    return frame.select(
        [
            (F.col(f"`{columns[name]}`").cast("string") if name in columns else F.lit(None).cast("string")).alias(name)
            for name in COLUMNS
        ]
    )
