"""Embedding drift on real ELPV cells, embedded by the product's own feature code (EfficientNet-Lite0, 224 px grey).

Reference: 400 monocrystalline cells, as a model trained on one line's cells would have them. Against it, three
batches of 60 cells never in the reference: more monocrystalline cells (the same source: no alarm), polycrystalline
cells (another cell type: an alarm), and monocrystalline cells as a different camera would take them (a little
blur, gamma and sensor noise: an alarm). About a minute on 2 cores, most of it the backbone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageFilter
from support.training_data import png, raw_row

from dgx_assets.production.drift import judge_embedding_drift

pytest.importorskip("elpv_dataset")

REFERENCE, BATCH = 400, 60


def another_camera(cell: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Softer optics (Gaussian blur, radius 0.5 px), another tone curve (gamma 0.9), noise of 1 % (2.5 grey levels)."""
    blurred = np.asarray(Image.fromarray(cell).filter(ImageFilter.GaussianBlur(0.5)), dtype=np.float64) / 255.0
    exposed = blurred**0.9 + rng.normal(0, 0.01, cell.shape)
    return (np.clip(exposed, 0, 1) * 255).round().astype(np.uint8)


def embed(cells: list[np.ndarray], batch: str) -> np.ndarray:
    """The `embedding` column image_features computes for these cells: PNG bytes through `compute_features`."""
    from dgx_assets.training.config import FeatureConfig
    from dgx_assets.training.features import compute_features

    config = FeatureConfig()  # the product's defaults: 224x224 grey, efficientnet_lite0
    rows = pd.DataFrame([raw_row(batch, "unlabelled", f"cell{i:04d}.png", png(cell)) for i, cell in enumerate(cells)])
    step = config.batch_rows  # Arrow batches of the feature job's size
    features = pd.concat([compute_features(rows.iloc[start : start + step], config) for start in range(0, len(rows), step)])
    assert (features["feature_status"] == "ok").all()
    return np.array(features["embedding"].tolist(), dtype=np.float32)


@pytest.fixture(scope="module")
def embeddings() -> dict[str, np.ndarray]:
    from elpv_dataset.utils import load_dataset

    images, _, types = load_dataset()
    rng = np.random.default_rng(0)
    mono = rng.permutation(np.flatnonzero(types == "mono"))
    poly = rng.permutation(np.flatnonzero(types == "poly"))
    reference, same, camera = np.split(mono[: REFERENCE + 2 * BATCH], [REFERENCE, REFERENCE + BATCH])
    cells = {
        "reference": [images[i] for i in reference],
        "same source": [images[i] for i in same],
        "another cell type": [images[i] for i in poly[:BATCH]],
        "another camera": [another_camera(images[i], rng) for i in camera],
    }
    return {name: embed(batch, name.replace(" ", "-")) for name, batch in cells.items()}


def test_the_embeddings_are_the_backbones_1280_features(embeddings):
    assert embeddings["reference"].shape == (REFERENCE, 1280)
    assert all(batch.shape == (BATCH, 1280) for name, batch in embeddings.items() if name != "reference")


def test_held_out_cells_of_the_same_type_raise_no_alarm(embeddings):
    result = judge_embedding_drift(embeddings["reference"], embeddings["same source"])
    assert not result.drifted, result.summary()
    assert result.p_value > 0.05 and result.roc_auc < 0.6
    assert (result.reference_compared, result.current_compared) == (REFERENCE, BATCH)


@pytest.mark.parametrize("source", ["another cell type", "another camera"])
def test_a_batch_from_another_source_raises_the_alarm(embeddings, source):
    result = judge_embedding_drift(embeddings["reference"], embeddings[source])
    assert result.drifted, result.summary()
    assert result.p_value <= 0.002 and result.roc_auc > 0.9
