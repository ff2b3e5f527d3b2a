"""What a scored batch says: how many images, the predicted defect rate, the probabilities' histogram, and, for
the images that came with an inspector's label, how often the champion agreed."""

from __future__ import annotations

import dataclasses

import numpy as np

HISTOGRAM_BINS = 10  # of P(defective) over 0..1: fine enough to show a threshold's neighbourhood


@dataclasses.dataclass(frozen=True)
class ScoredBatch:
    images: int
    production_images: int  # without a label: what the line sends
    predicted_positive: int
    positive_class: str | None
    histogram: list[tuple[float, float, int]]  # (from, to, images) of defect_probability
    labelled_images: int
    labelled_correct: int

    @property
    def predicted_defect_rate(self) -> float | None:
        return self.predicted_positive / self.images if self.images and self.positive_class else None

    @property
    def labelled_accuracy(self) -> float | None:
        return self.labelled_correct / self.labelled_images if self.labelled_images else None


def scored_batch(rows: dict[str, list], positive_class: str | None) -> ScoredBatch:
    """The figures of one batch's defect_predictions rows (columns label, predicted_label, defect_probability)."""
    labels, predicted = rows["label"], rows["predicted_label"]
    scores = np.array([p for p in rows["defect_probability"] if p is not None], dtype=np.float64)
    counts, edges = np.histogram(scores, bins=HISTOGRAM_BINS, range=(0.0, 1.0))
    labelled = [(label, guess) for label, guess in zip(labels, predicted) if label is not None]
    return ScoredBatch(
        images=len(predicted),
        production_images=sum(1 for label in labels if label is None),
        predicted_positive=sum(1 for guess in predicted if guess == positive_class),
        positive_class=positive_class,
        histogram=[(round(float(a), 2), round(float(b), 2), int(n)) for a, b, n in zip(edges[:-1], edges[1:], counts)],
        labelled_images=len(labelled),
        labelled_correct=sum(1 for label, guess in labelled if label == guess),
    )
