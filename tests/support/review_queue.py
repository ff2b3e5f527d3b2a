"""A lake for the review queue's tests: raw_images holding real image bytes (committed as ingest commits them,
without Spark), and the champion's scores of a production batch as defect_predictions rows."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from imagefactory import encode, gradient
from PIL import Image

from support.lake_tables import commit_rows

CLASSES = ["defective", "functional"]
RAW_IMAGES = pa.schema(
    [
        ("path", pa.string()),
        ("batch", pa.string()),
        ("label", pa.string()),
        ("size_bytes", pa.int64()),
        ("sha256", pa.string()),
        ("format", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("content", pa.binary()),
    ]
)


@dataclass
class QueueLake:
    root: Path
    batch: str
    images: dict[str, bytes]  # sha256 -> bytes, of the production batch
    scores: list[dict]  # defect_predictions rows of the batch: sha256, path, defect_probability
    saliency: dict[str, bytes]  # sha256 -> a PNG


def png(seed: int) -> bytes:
    return encode(Image.fromarray(gradient(seed=seed), "L"), "PNG")


def jpeg(seed: int) -> bytes:
    return encode(Image.fromarray(np.stack([gradient(seed=seed)] * 3, axis=-1), "RGB"), "JPEG")


def _row(path: str, batch: str, label: str | None, data: bytes | None, fmt: str | None) -> dict:
    sha256 = hashlib.sha256(data).hexdigest() if data else "0" * 64
    status, reason = ("valid", None) if data else ("corrupted", "truncated")
    return {
        **{"path": path, "batch": batch, "label": label, "size_bytes": len(data or b"x"), "sha256": sha256, "format": fmt},
        **{"width": 64, "height": 48, "status": status, "reason": reason, "content": data},
    }


def build_queue_lake(root: Path, batch: str, probabilities: list[float]) -> QueueLake:
    """One production image per probability (every third a JPEG, the others PNGs) and a corrupted file in
    `batch`; two labelled images in batch `train`, so that the classes are ones raw_images knows."""
    rows = []
    for n, probability in enumerate(probabilities):
        data, fmt = (jpeg(n), "JPEG") if n % 3 == 2 else (png(n), "PNG")
        rows.append((_row(f"file:/landing/{batch}/cell-{n}.{fmt.lower()}", batch, None, data, fmt), probability))
    production = [row for row, _ in rows] + [_row(f"file:/landing/{batch}/broken.png", batch, None, None, None)]
    training = [
        _row(f"file:/landing/train/{label}/t{n}.png", "train", label, png(100 + n), "PNG") for n, label in enumerate(CLASSES)
    ]
    commit_rows(root, "raw_images", pa.Table.from_pylist(production, RAW_IMAGES), batch)
    commit_rows(root, "raw_images", pa.Table.from_pylist(training, RAW_IMAGES), "train")
    scores = [{"sha256": row["sha256"], "path": row["path"], "defect_probability": p} for row, p in rows]
    images = {row["sha256"]: row["content"] for row, _ in rows}
    saliency = {sha256: png(200 + n) for n, sha256 in enumerate(images)}
    return QueueLake(root, batch, images, scores, saliency)
