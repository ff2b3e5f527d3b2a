"""How different the generated images are from each other, beyond "each one decodes".

Each valid image is embedded by the backbone image_features uses (ImageNet EfficientNet-Lite0, through the same
decode and resize, `training.features.compute_features`), and the batch's diversity is the mean pairwise cosine
distance of those embeddings. Measured here: random ELPV cells 0.35-0.40, the mono defect-free cells alone 0.21,
one cell under sensor noise 0.009, and the 12 demo images of an earlier quick stand-in generator, which drew each
class's mean image whatever the seed, 0.069.
A batch below the threshold is flagged as near-duplicates: a generator ignoring its prompts (mode collapse).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_MEAN_DISTANCE = 0.1  # between class-mean near-duplicates (0.069) and the most uniform real cells (0.21)
MAX_IMAGES = 256  # embedded per check: 32,640 pairs, seconds on a CPU, however many images the table holds


@dataclass(frozen=True)
class Diversity:
    images: int
    mean_distance: float  # mean cosine distance over every pair, 0 (identical) .. 1 (unrelated) .. 2
    closest: list[tuple[str, str, float]]  # the most similar pairs: (id, id, distance), closest first

    def near_duplicates(self, min_mean_distance: float = MIN_MEAN_DISTANCE) -> bool:
        return self.mean_distance < min_mean_distance


def pairwise_diversity(ids: Sequence[str], vectors: np.ndarray, closest: int = 3) -> Diversity:
    """Mean pairwise cosine distance of `vectors` (one row per image, in the order of `ids`)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    if len(ids) != len(vectors) or len(ids) < 2:
        raise ValueError(f"need at least two images with one vector each, got {len(ids)} ids and {len(vectors)} vectors")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1.0, norms)
    distances = 1.0 - unit @ unit.T
    first, second = np.triu_indices(len(ids), k=1)
    pairs = distances[first, second]
    order = np.argsort(pairs, kind="stable")[:closest]
    nearest = [(str(ids[int(first[i])]), str(ids[int(second[i])]), round(float(pairs[i]), 4)) for i in order]
    return Diversity(len(ids), float(pairs.mean()), nearest)


def embed(contents: Sequence[bytes]) -> np.ndarray:
    """The images' embeddings from image_features' default backbone and preprocessing (TensorFlow)."""
    import pandas as pd

    from dgx_assets.training.config import FeatureConfig
    from dgx_assets.training.features import compute_features

    blank = {"sha256": "", "path": "", "batch": "", "label": "", "split": "", "width": 0, "height": 0}
    rows = pd.DataFrame({"content": list(contents), **blank})
    features = compute_features(rows, FeatureConfig())
    failed = features["feature_status"] != "ok"
    if failed.any():
        raise ValueError(f"{int(failed.sum())} image(s) could not be embedded: {features.loc[failed, 'feature_error'].iloc[0]}")
    return np.stack([np.asarray(vector, dtype=np.float32) for vector in features["embedding"]])
