"""raw_images-shaped rows for the training tests: real ELPV cells, and a learnable synthetic defect set."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from dgx_assets.ingest import images
from dgx_assets.ingest.spark_ingest import RAW_IMAGES_SCHEMA

# A small, quiet local Spark for these tests (no UI, no event log, two cores).
SPARK_TEST_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
}

# raw_images' layout, without the two timestamps these hand-made partitions do not need.
RAW_SCHEMA = pa.schema([field for field in RAW_IMAGES_SCHEMA if field.name not in ("modified_at", "ingested_at")])


def split_for(sha256: str) -> str:
    """ingest's own split, with a larger test share so small test sets still hold both classes."""
    return images.split_for(sha256, validation=0.15, test=0.2)


def raw_row(batch: str, label: str, name: str, data: bytes, status: str = "valid", split: str | None = None) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    width = height = None
    fmt = mode = None
    if status == "valid":
        try:
            with Image.open(io.BytesIO(data)) as img:
                width, height, fmt, mode = img.width, img.height, img.format, img.mode
        except Exception:
            pass  # a row ingest called valid whose bytes the feature job cannot read
    return {
        "path": f"file:///landing/{batch}/{label}/{name}",
        "batch": batch,
        "label": label,
        "size_bytes": len(data),
        "sha256": digest,
        "format": fmt,
        "width": width,
        "height": height,
        "mode": mode,
        "status": status,
        "reason": "" if status == "valid" else f"test: {status}",
        "split": (split or split_for(digest)) if status == "valid" else None,
        "content": data if status == "valid" else None,
    }


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def elpv_raw_rows(count: int, batch: str, seed: int = 0) -> pd.DataFrame:
    """`count` real ELPV cells: defect probability 0 -> functional, >= 2/3 -> defective (half each)."""
    from elpv_dataset.utils import load_dataset

    images, probabilities, _ = load_dataset()
    rng = np.random.default_rng(seed)
    functional = rng.permutation(np.flatnonzero(probabilities == 0))[: count // 2]
    defective = rng.permutation(np.flatnonzero(probabilities >= 0.6))[: count - count // 2]
    rows = [raw_row(batch, "functional", f"cell{i:04d}.png", png(images[i])) for i in functional]
    rows += [raw_row(batch, "defective", f"cell{i:04d}.png", png(images[i])) for i in defective]
    return pd.DataFrame(rows)


def synthetic_cell(rng: np.random.Generator, defective: bool, size: int = 48) -> np.ndarray:
    """A noisy grey cell; defective ones carry a dark crack: easy to learn, not trivial."""
    cell = rng.normal(150, 25, size=(size, size)).clip(0, 255)
    cell[:, :: size // 4] *= 0.7  # busbars
    if defective:
        start, end = rng.integers(0, size, 2)
        for x in range(size):
            y = int(start + (end - start) * x / size)
            cell[max(0, y - 1) : y + 2, x] *= 0.25
    return cell.astype(np.uint8)


def synthetic_raw_rows(count: int, batch: str, seed: int = 0, defect_share: float = 0.35) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        defective = rng.random() < defect_share
        label = "defective" if defective else "functional"
        rows.append(raw_row(batch, label, f"s{seed}_{index:04d}.png", png(synthetic_cell(rng, defective))))
    return pd.DataFrame(rows)


def raw_table(rows: pd.DataFrame) -> pa.Table:
    """Rows in raw_images' columns (`batch` included: the table's partition column is stored in its files)."""
    return pa.Table.from_pandas(rows, schema=RAW_SCHEMA, preserve_index=False)


def commit_raw_batch(rows: pd.DataFrame | list[pd.DataFrame], lake_root: Path, batch: str, row_group_size: int | None = None):
    """Committed as raw_images commits a batch (one Iceberg transaction; a list: one file each); returns the
    batch's files in the new snapshot (`catalog.TableSnapshot`)."""
    from dgx_assets.lake.store import Lake
    from support.lake_tables import commit_rows

    tables = [raw_table(part) for part in rows] if isinstance(rows, list) else raw_table(rows)
    snapshot_id = commit_rows(lake_root, "raw_images", tables, batch, row_group_size)
    return Lake(str(lake_root)).tables.snapshot("raw_images", snapshot_id, batch)


def write_feature_partitions(root: Path, config, rows_per_batch: int, batches=("b0", "b1")) -> list[Path]:
    """image_features partitions computed by the real feature code from synthetic raw rows."""
    from dgx_assets.training.features import compute_features

    paths = []
    for seed, batch in enumerate(batches):
        features = compute_features(synthetic_raw_rows(rows_per_batch, batch, seed=seed), config)
        folder = root / f"batch={batch}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(features, preserve_index=False), folder / "part-00000.parquet")
        paths.append(folder / "part-00000.parquet")
    return paths
