"""From class probabilities to a decision: test-time augmentation and the decision threshold.

Plain NumPy around a Keras model; trained_model, the edge gate and the cross-validation benchmark share it so
the figures they report come from the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# "defective" is the positive class of a defect classifier; with any other two names the second (sorted) one is.
POSITIVE_CLASS = "defective"


@dataclass(frozen=True)
class Decision:
    """How a model's probabilities become a class; recorded with the model, applied the same way everywhere."""

    tta: bool = False  # the model averages the 8 dihedral views of each image in its own graph
    threshold: float | None = None  # on P(positive); None: argmax
    positive_index: int | None = None  # the class the threshold is on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> Decision:
        return cls(**{key: value for key, value in (values or {}).items() if key in cls.__dataclass_fields__})


def positive_index(class_names: Sequence[str]) -> int | None:
    """The class a decision threshold applies to, or None for more than two classes (argmax decides)."""
    if len(class_names) != 2:
        return None
    return list(class_names).index(POSITIVE_CLASS) if POSITIVE_CLASS in class_names else 1


def decide(probabilities: np.ndarray, threshold: float | None, positive: int | None) -> np.ndarray:
    """Class index per row: P(positive) >= threshold for two classes with a threshold, argmax otherwise."""
    probabilities = np.asarray(probabilities)
    if threshold is None or positive is None:
        return probabilities.argmax(axis=1)
    return np.where(probabilities[:, positive] >= threshold, positive, 1 - positive)


def choose_threshold(labels: np.ndarray, probabilities: np.ndarray, positive: int, *, step: float = 0.01) -> float:
    """The threshold on P(positive) with the best accuracy on these (validation) images.

    Among thresholds tied on accuracy, the one nearest 0.5: a small validation split should move the
    decision only as far as its evidence goes.
    """
    labels, scores = np.asarray(labels), np.asarray(probabilities)[:, positive]
    candidates = np.round(np.arange(step, 1.0, step), 6)
    correct = [(np.where(scores >= t, positive, 1 - positive) == labels).sum() for t in candidates]
    best = max(correct)
    tied = candidates[np.asarray(correct) == best]
    return float(tied[np.argmin(np.abs(tied - 0.5))])


def dihedral_views(images: np.ndarray) -> list[np.ndarray]:
    """The 8 flips and quarter turns of square [n, h, w, c] images (the 4 flips of non-square ones): the
    orientations training augments over, so each is an image the model has learned to read."""
    views = []
    for turns in range(4 if images.shape[1] == images.shape[2] else 1):
        turned = np.rot90(images, k=turns, axes=(1, 2))
        views += [turned, turned[:, :, ::-1]]
    if images.shape[1] != images.shape[2]:
        views += [images[:, ::-1], images[:, ::-1, ::-1]]
    return [np.ascontiguousarray(view) for view in views]


def predict(model: Any, images: np.ndarray, *, tta: bool = False, batch_size: int = 64) -> np.ndarray:
    """Class probabilities of uint8/float pixel images; with `tta` the mean over the dihedral views."""
    images = np.asarray(images, dtype=np.float32)
    views = dihedral_views(images) if tta else [images]
    return np.mean([model.predict(view, batch_size=batch_size, verbose=0) for view in views], axis=0)
