"""Drift of a production batch against the images the model was trained on: its embeddings, its predictions.

``judge_embedding_drift`` is Evidently's default embedding-drift method, the domain classifier (``model``: can
a classifier tell the batch's embeddings from the reference's? drift when its ROC AUC > 0.55), made sound at
line sizes. A bare AUC bar on 60 images is noise: a held-out AUC over 30 of them has a standard deviation near
0.05. So here the AUC is out of sample and comes with a permutation p-value:

1. Subsample: each side to at most ``max_rows``, the reference to at most ``balance`` times the batch.
2. PCA of the pooled rows, whitened, to ``components`` axes. It never sees which row is which side.
3. Least squares of the side (reference 0, batch 1) on those axes (Fisher's discriminant, regularised by the
   truncation), scored leave-one-out. The exact leave-one-out scores need no refit: they come from the hat
   matrix, which does not depend on the labels either.
4. The ROC AUC of those scores is the figure; the p-value is the share of random relabellings whose AUC, with
   step 3 redone, reaches it. A relabelling costs two thin matrix products and a sort, so 999 are cheap.

Steps 2-3 use the labels only through the least squares that every relabelling redoes, so the test is exact:
on a batch drawn like the reference, ``p_value < alpha`` happens at most a share ``alpha`` of the time.
docs/decisions/0005-embedding-drift.md has the measurements behind these choices.

``prediction_drift`` compares a batch's predicted defect rate with the training prevalence (exact binomial test).
"""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np
from threadpoolctl import threadpool_limits

DRIFT_CHECK = "embedding_drift"  # the asset check's name: the check, the retraining sensor and the report share it
DOMAIN_CLASSIFIER = "domain classifier (Evidently: model)"
EVIDENTLY_AUC_THRESHOLD = 0.55  # Evidently's bar for its model method, kept here as the effect-size bar
MIN_ROWS = 10
DRIFT_CHECK = "embedding_drift"  # the asset check of defect_predictions that reports this verdict


@dataclasses.dataclass(frozen=True)
class EmbeddingDrift:
    """The verdict of ``judge_embedding_drift``.

    ``drifted`` needs evidence and size: ``p_value < alpha`` (the classifier tells the batch apart better than
    chance would, at a false-alarm rate of ``alpha``) and ``roc_auc > auc_threshold`` (by more than Evidently's
    bar: against thousands of rows a harmless shift becomes significant, and an AUC of 0.52 is not worth an alarm).
    """

    method: str
    roc_auc: float  # leave-one-out; 0.5 is chance (a little under, on average, for leave-one-out), 1.0 apart row by row
    p_value: float  # permutation p-value, at least 1 / (permutations + 1)
    alpha: float
    auc_threshold: float
    drifted: bool
    reference_rows: int  # rows given
    current_rows: int
    reference_compared: int  # rows compared, after subsampling
    current_compared: int
    components: int
    permutations: int
    seed: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        verdict = "drift" if self.drifted else "no drift"
        return (
            f"embedding {verdict}: ROC AUC {self.roc_auc:.3f} (bar {self.auc_threshold}), p = {self.p_value:.3g} "
            f"(alpha {self.alpha}, {self.permutations} permutations); {self.current_compared} batch vs "
            f"{self.reference_compared} reference rows, {self.components} components"
        )


def judge_embedding_drift(
    reference: np.ndarray,
    current: np.ndarray,
    *,
    alpha: float = 0.01,
    seed: int = 0,
    auc_threshold: float = EVIDENTLY_AUC_THRESHOLD,
    components: int = 32,
    permutations: int = 999,
    max_rows: int = 2000,
    balance: float = 8.0,
) -> EmbeddingDrift:
    """Whether the batch ``current`` (rows x dims) is drawn unlike ``reference`` (the training images' embeddings).

    The method is in the module docstring. Deterministic for a seed. Raises ValueError on fewer than 10 rows a
    side, mismatched dims, non-finite values, or an ``alpha`` the permutations cannot resolve.
    """
    reference = _embeddings("reference", reference)
    current = _embeddings("current", current)
    if reference.shape[1] != current.shape[1]:
        raise ValueError(
            f"reference embeddings have {reference.shape[1]} dims, current {current.shape[1]}: not from the same model"
        )
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    if alpha * (permutations + 1) <= 1:
        raise ValueError(f"with {permutations} permutations no p-value is below {alpha}: use more than {1 / alpha - 1:.0f}")
    if components < 1 or max_rows < MIN_ROWS or balance < 1:
        raise ValueError(f"need components >= 1, max_rows >= {MIN_ROWS}, balance >= 1; got {components}, {max_rows}, {balance}")

    rng = np.random.default_rng(seed)
    n_current = min(len(current), max_rows)
    n_reference = min(len(reference), max_rows, math.ceil(balance * n_current))
    pooled = np.concatenate([_sample(reference, n_reference, rng), _sample(current, n_current, rng)], dtype=np.float64)
    labels = np.r_[np.zeros(n_reference), np.ones(n_current)]
    order = rng.permutation(len(pooled))  # so that tied scores break at random, not by side
    # Small matrices: one BLAS thread is faster than several, which spin against each other on a busy machine.
    with threadpool_limits(1):
        axes = _principal_axes(pooled[order], components, seed)
        if axes.shape[1]:
            observed, null = _leave_one_out_aucs(axes, labels[order], permutations, rng)
            p_value = (1 + int(np.count_nonzero(null >= observed))) / (permutations + 1)
        else:  # every row alike: nothing to tell apart
            observed, p_value = 0.5, 1.0
    return EmbeddingDrift(
        method=DOMAIN_CLASSIFIER,
        roc_auc=observed,
        p_value=p_value,
        alpha=alpha,
        auc_threshold=auc_threshold,
        drifted=p_value < alpha and observed > auc_threshold,
        reference_rows=len(reference),
        current_rows=len(current),
        reference_compared=n_reference,
        current_compared=n_current,
        components=axes.shape[1],
        permutations=permutations,
        seed=seed,
    )


def _embeddings(side: str, rows: np.ndarray) -> np.ndarray:
    array = np.asarray(rows)
    if array.ndim != 2:
        raise ValueError(f"{side} embeddings must be a 2-d array (rows x dims), got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{side} embeddings must be numbers, got dtype {array.dtype}")
    if len(array) < MIN_ROWS:
        raise ValueError(f"{side} embeddings have {len(array)} rows: drift needs at least {MIN_ROWS}")
    if array.shape[1] < 1:
        raise ValueError(f"{side} embeddings have no dims")
    bad_rows = np.count_nonzero(~np.isfinite(array).all(axis=1))
    if bad_rows:
        raise ValueError(f"{side} embeddings hold NaN or infinite values in {bad_rows} of {len(array)} rows")
    return array


def _sample(rows: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    return rows if count == len(rows) else rows[np.sort(rng.choice(len(rows), count, replace=False))]


def _principal_axes(pooled: np.ndarray, components: int, seed: int) -> np.ndarray:
    """The whitened scores of the pooled rows on their top principal axes: orthonormal columns (rows x k)."""
    centred = pooled - pooled.mean(axis=0)
    # At most a quarter as many axes as rows, so that no row's leverage nears 1 and leave-one-out stays stable.
    k = max(1, min(components, len(pooled) // 4, pooled.shape[1]))
    if len(pooled) <= pooled.shape[1]:  # fewer rows than dims: the exact route through the rows' Gram matrix is cheap
        from scipy.linalg import eigh

        n = len(pooled)
        variances, scores = eigh(centred @ centred.T, subset_by_index=[n - k, n - 1])
        singular, scores = np.sqrt(np.clip(variances[::-1], 0, None)), scores[:, ::-1]
    else:
        from sklearn.utils.extmath import randomized_svd

        # n_iter: sklearn's default ('auto') is 7 here; 4 finds these axes as well. Its stub types it as str only.
        scores, singular, _ = randomized_svd(centred, k, n_iter=4, random_state=seed)  # pyright: ignore[reportArgumentType]
    # Spread below float32's resolution of the values is rounding, not a direction the rows vary in.
    resolution = 1e-6 * float(np.abs(pooled).max()) * math.sqrt(len(pooled))
    return scores[:, singular > resolution]


def _leave_one_out_aucs(
    axes: np.ndarray, labels: np.ndarray, permutations: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """ROC AUC of the leave-one-out least-squares scores for the labels, and for `permutations` shuffles of them.

    With orthonormal axes U and an intercept, the hat matrix is 11'/n + UU', so the fit of all labellings at once is
    two thin products, and the leave-one-out score of row i is (fit_i - h_i y_i) / (1 - h_i), h_i its leverage.
    """
    n, positives = len(labels), int(labels.sum())
    labellings = np.vstack([labels, rng.permuted(np.tile(labels, (permutations, 1)), axis=1)])  # one per row
    mean = positives / n
    fits = mean + ((labellings - mean) @ axes) @ axes.T
    leverage = 1 / n + np.einsum("ij,ij->i", axes, axes)
    scores = (fits - leverage * labellings) / np.maximum(1 - leverage, 1e-12)
    ranked = np.take_along_axis(labellings, np.argsort(scores, axis=1), axis=1)
    rank_sums = ranked @ np.arange(1, n + 1)
    aucs = (rank_sums - positives * (positives + 1) / 2) / (positives * (n - positives))
    return float(aucs[0]), aucs[1:]


@dataclasses.dataclass(frozen=True)
class PredictionDrift:
    """A batch's predicted defect rate against the training prevalence: exact binomial test, Wilson 95 % interval."""

    defect_count: int
    images: int
    rate: float
    training_prevalence: float
    p_value: float  # two-sided exact binomial test of rate == training_prevalence
    rate_low: float  # Wilson 95 % interval of the rate
    rate_high: float
    alpha: float
    drifted: bool  # p_value < alpha

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        verdict = "drift" if self.drifted else "no drift"
        return (
            f"prediction {verdict}: {self.defect_count}/{self.images} predicted defective = {self.rate:.1%} "
            f"(95 % CI {self.rate_low:.1%}-{self.rate_high:.1%}) vs training prevalence {self.training_prevalence:.1%}, "
            f"p = {self.p_value:.3g} (exact binomial, alpha {self.alpha})"
        )


def prediction_drift(defect_count: int, images: int, training_prevalence: float, *, alpha: float = 0.01) -> PredictionDrift:
    """Whether a batch's share of images predicted defective departs from the training set's share of defects."""
    from scipy.stats import binomtest

    defect_count, images = operator.index(defect_count), operator.index(images)  # counts, not floats
    if images < 1 or not 0 <= defect_count <= images:
        raise ValueError(f"need 0 <= defect_count <= images and images >= 1, got {defect_count} of {images}")
    if not 0 < training_prevalence < 1:
        raise ValueError(f"training_prevalence must be strictly between 0 and 1, got {training_prevalence}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    test = binomtest(defect_count, images, training_prevalence)
    interval = test.proportion_ci(confidence_level=0.95, method="wilson")
    return PredictionDrift(
        defect_count=defect_count,
        images=images,
        rate=defect_count / images,
        training_prevalence=float(training_prevalence),
        p_value=float(test.pvalue),
        rate_low=float(interval.low),
        rate_high=float(interval.high),
        alpha=alpha,
        drifted=bool(test.pvalue < alpha),
    )
