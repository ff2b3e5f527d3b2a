"""Synthetic embeddings shaped like the backbone's: a mean, 16 latent factors of decreasing weight, noise. The drift
tests and bench/drift.py draw from the same source, so a benchmark's batch is a test's batch."""

import math

import numpy as np

DIMS, FACTORS, NOISE = 1280, 16, 0.25
BATCH = 60  # images of a line's batch


class Source:
    """A camera and line: embeddings = mean + factors @ loadings + noise, all of it fixed by the seed."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        weights = 3.0 / np.sqrt(1 + np.arange(FACTORS))
        self.loadings = rng.normal(0, 8 / math.sqrt(DIMS), (FACTORS, DIMS)) * weights[:, None]
        self.mean = np.abs(rng.normal(0.2, 0.3, DIMS))
        self.new_direction = rng.normal(0, 1, DIMS) / math.sqrt(DIMS)  # a unit vector outside the factors, nearly

    def draw(self, rows: int, rng: np.random.Generator, shift: np.ndarray | float = 0.0) -> np.ndarray:
        factors = rng.normal(0, 1, (rows, FACTORS))
        noise = rng.normal(0, NOISE, (rows, DIMS))
        return (self.mean + factors @ self.loadings + noise + shift).astype(np.float32)
