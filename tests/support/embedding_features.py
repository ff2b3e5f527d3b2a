"""image_features batches with learnable embeddings, committed in the asset's own schema (no backbone run)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from dgx_assets.training.features import FEATURE_SCHEMA
from support.lake_tables import commit_rows

SPLITS = ("train",) * 7 + ("validation", "test", "test")
DIMS = 16


def write_embedding_features(
    lake_root: Path, batches: int = 2, rows: int = 120, embeddings: bool = True, seed: int = 3
) -> list[str]:
    """`defective` rows have a shifted embedding in 4 of 16 dimensions; splits 70/10/20 by row."""
    rng = np.random.default_rng(seed)
    keys = []
    for b in range(batches):
        key = f"emb-{b}"
        records = []
        for i in range(rows):
            defective = i % 3 == 0  # imbalanced, as ELPV is
            vector = rng.normal(0, 1, DIMS).astype(np.float32)
            vector[:4] += 1.6 if defective else 0.0
            sha = hashlib.sha256(f"{key}-{i}".encode()).hexdigest()
            records.append(
                {
                    "sha256": sha,
                    "path": f"file:///landing/{key}/{i}.png",
                    "batch": key,
                    "label": "defective" if defective else "functional",
                    "split": SPLITS[i % len(SPLITS)],
                    "source_width": 4,
                    "source_height": 4,
                    "tensor": bytes(16),
                    "tensor_shape": [4, 4, 1],
                    "brightness": 0.5,
                    "contrast": 0.1,
                    "sharpness": 1.0,
                    "embedding": vector.tolist() if embeddings else None,
                    "feature_status": "ok",
                    "feature_error": None,
                    "feature_device": "cpu",
                }
            )
        commit_rows(lake_root, "image_features", pa.Table.from_pylist(records, schema=FEATURE_SCHEMA), key)
        keys.append(key)
    return keys
