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

    views: int = 1  # the model averages this many `dihedral_views` of each image in its own graph
    threshold: float | None = None  # on P(positive); None: argmax
    positive_index: int | None = None  # the class the threshold is on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> Decision:
        values = dict(values or {})
        if values.pop("tta", False):  # recorded before the view count was a setting: all 8
            values.setdefault("views", 8)
        return cls(**{key: value for key, value in values.items() if key in cls.__dataclass_fields__})


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


def shrink_toward_half(threshold: float, shrinkage: float) -> float:
    """`threshold` moved `shrinkage` of the way back to 0.5 (0 keeps it, 1 is 0.5): a validation split of a few
    hundred images picks thresholds that scatter between folds, and part of the scatter is its noise."""
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"threshold shrinkage is a fraction from 0 to 1, got {shrinkage}")
    return round(threshold + shrinkage * (0.5 - threshold), 6)


# The square's 8 symmetries as (quarter turns counterclockwise, mirrored first), and the groups of them that
# test-time augmentation may average (a group: no orientation weighs more than another). Four views are the
# quarter turns: in ELPV's cross-validation they decided like all eight (BENCHMARKS.md section 10).
DIHEDRAL = tuple((turns, mirrored) for mirrored in (False, True) for turns in range(4))
VIEW_GROUPS = {1: (0,), 2: (0, 4), 4: (0, 1, 2, 3), 8: tuple(range(8))}
TEST_TIME_VIEWS = tuple(VIEW_GROUPS)


def turns_a_quarter(count: int) -> bool:
    """Whether the group of `count` views turns images a quarter, which only square images survive."""
    return any(DIHEDRAL[index][0] % 2 for index in VIEW_GROUPS[count])


def dihedral_views(images: np.ndarray, count: int = 8) -> list[np.ndarray]:
    """The `count` views of VIEW_GROUPS of [n, h, w, c] images: the image; and its mirror image (width
    flipped); or its quarter turns; or all eight. Quarter turns need square images."""
    if count not in VIEW_GROUPS:
        raise ValueError(f"the views come in groups of {TEST_TIME_VIEWS}, not {count}")
    if turns_a_quarter(count) and images.shape[1] != images.shape[2]:
        raise ValueError(f"quarter turns need square images, got {images.shape[1]}x{images.shape[2]}")
    views = []
    for turns, mirrored in (DIHEDRAL[index] for index in VIEW_GROUPS[count]):
        views.append(np.ascontiguousarray(np.rot90(images[:, :, ::-1] if mirrored else images, k=turns, axes=(1, 2))))
    return views


def predict(model: Any, images: np.ndarray, *, views: int = 1, batch_size: int = 64) -> np.ndarray:
    """Class probabilities of uint8/float pixel images: the mean over their `views` dihedral views."""
    images = np.asarray(images, dtype=np.float32)
    return np.mean([model.predict(view, batch_size=batch_size, verbose=0) for view in dihedral_views(images, views)], axis=0)
