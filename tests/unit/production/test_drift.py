"""Embedding and prediction drift on synthetic numbers: false alarms at line sizes, power, refusals, hand-made figures.

The embeddings are shaped like the backbone's (1,280 dims): a mean, 16 latent factors of decreasing weight, and
noise, so most of the variance lies in a few directions, as in real pooled CNN features.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from support.synthetic_embeddings import BATCH, DIMS, Source

from dgx_assets.production.drift import EmbeddingDrift, judge_embedding_drift, prediction_drift


@pytest.fixture(scope="module")
def source() -> Source:
    return Source()


@pytest.fixture(scope="module")
def reference(source) -> np.ndarray:
    return source.draw(2000, np.random.default_rng(1))


def test_batches_drawn_like_the_reference_raise_no_more_alarms_than_alpha_allows(source, reference):
    results = [
        judge_embedding_drift(reference, source.draw(BATCH, np.random.default_rng(100 + i)), alpha=0.01, seed=i)
        for i in range(100)
    ]
    alarms = sum(result.drifted for result in results)
    # At most 1 % in expectation; 6 or more of 100 would happen with probability 0.0005.
    assert alarms <= 5, [result.summary() for result in results if result.drifted]
    # The p-values are those of a working test, not of one that never rejects: about uniform.
    p_values = [result.p_value for result in results]
    assert 0.3 < statistics.median(p_values) < 0.7
    assert sum(p < 0.2 for p in p_values) >= 8
    assert statistics.mean(result.roc_auc for result in results) < 0.53


@pytest.mark.parametrize(
    "change",
    [
        "a new direction: a lens artefact 1.5 noise units along an axis the reference does not vary in",
        "the first factor moved by one of its own standard deviations: the line's lighting changed",
    ],
)
def test_a_batch_from_another_source_is_flagged(source, reference, change):
    if change.startswith("a new direction"):
        shift = 1.5 * source.new_direction / np.linalg.norm(source.new_direction)
    else:
        shift = source.loadings[0]  # one standard deviation of the first factor: a per-image AUC near 0.76
    results = [
        judge_embedding_drift(reference, source.draw(BATCH, np.random.default_rng(200 + i), shift), seed=i) for i in range(10)
    ]
    assert sum(result.drifted for result in results) >= 9, [result.summary() for result in results]  # power >= 0.9
    assert all(result.drifted == (result.p_value < 0.01 and result.roc_auc > 0.55) for result in results)


def test_the_verdict_is_deterministic_for_a_seed_and_records_what_it_compared(source, reference):
    batch = source.draw(BATCH, np.random.default_rng(7))
    first, again = judge_embedding_drift(reference, batch, seed=3), judge_embedding_drift(reference, batch, seed=3)
    assert first == again
    assert isinstance(first, EmbeddingDrift) and first.method == "domain classifier (Evidently: model)"
    assert (first.reference_rows, first.current_rows) == (2000, BATCH)
    assert (first.reference_compared, first.current_compared) == (8 * BATCH, BATCH)  # the reference balanced down
    assert first.components == 32 and first.permutations == 999 and first.auc_threshold == 0.55
    assert 1 / 1000 <= first.p_value <= 1
    record = first.to_dict()
    assert record["roc_auc"] == first.roc_auc and record["drifted"] is first.drifted
    assert f"ROC AUC {first.roc_auc:.3f}" in first.summary() and "480 reference rows" in first.summary()


def test_a_big_batch_against_a_big_reference_is_subsampled_to_the_row_cap(source, reference):
    result = judge_embedding_drift(reference, source.draw(2500, np.random.default_rng(8)), max_rows=1000)
    assert (result.reference_compared, result.current_compared) == (1000, 1000)
    assert (result.reference_rows, result.current_rows) == (2000, 2500)


def test_rows_all_alike_are_no_drift_not_a_coin_toss_between_rounding_errors():
    rows = np.tile(np.random.default_rng(0).normal(size=DIMS).astype(np.float32), (40, 1))
    result = judge_embedding_drift(rows, rows[:20])
    assert (result.drifted, result.roc_auc, result.p_value, result.components) == (False, 0.5, 1.0, 0)


@pytest.mark.parametrize(
    ("reference_rows", "current_rows", "message"),
    [
        (np.zeros((100, 8)), np.zeros((9, 8)), "current embeddings have 9 rows: drift needs at least 10"),
        (np.zeros((5, 8)), np.zeros((60, 8)), "reference embeddings have 5 rows"),
        (np.zeros((100, 8)), np.zeros((60, 9)), "reference embeddings have 8 dims, current 9"),
        (np.zeros((100, 8)), np.zeros(60), "must be a 2-d array"),
        (np.zeros((100, 8)), np.full((60, 8), "0.5"), "must be numbers"),
    ],
)
def test_unusable_embeddings_are_refused_with_the_reason(reference_rows, current_rows, message):
    with pytest.raises(ValueError, match=message):
        judge_embedding_drift(reference_rows, current_rows)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_with_the_count_of_rows(bad):
    current = np.zeros((60, 8))
    current[[3, 17], 2] = bad
    with pytest.raises(ValueError, match="NaN or infinite values in 2 of 60 rows"):
        judge_embedding_drift(np.zeros((100, 8)), current)


def test_an_alpha_the_permutations_cannot_reach_is_refused():
    rows = np.random.default_rng(0).normal(size=(60, 8))
    with pytest.raises(ValueError, match="no p-value is below 0.01"):
        judge_embedding_drift(rows, rows, permutations=99)
    with pytest.raises(ValueError, match="alpha must be between 0 and 1"):
        judge_embedding_drift(rows, rows, alpha=1.5)


def _binomial_two_sided(k: int, n: int, p: float) -> float:
    """The exact test by hand: the probability of every count no likelier than k."""
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-7)))


def _wilson(k: int, n: int) -> tuple[float, float]:
    z = statistics.NormalDist().inv_cdf(0.975)
    rate = k / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize(("defects", "images", "prevalence"), [(12, 60, 0.27), (31, 60, 0.27), (0, 20, 0.27), (60, 60, 0.5)])
def test_prediction_drift_matches_the_hand_computed_binomial_test_and_wilson_interval(defects, images, prevalence):
    result = prediction_drift(defects, images, prevalence)
    assert result.rate == defects / images
    assert result.p_value == pytest.approx(_binomial_two_sided(defects, images, prevalence), rel=1e-9)
    assert (result.rate_low, result.rate_high) == pytest.approx(_wilson(defects, images), abs=1e-12)
    assert result.drifted == (result.p_value < 0.01)
    assert result.to_dict()["p_value"] == result.p_value
    assert f"{defects}/{images} predicted defective" in result.summary()


def test_prediction_drift_flags_a_batch_whose_defect_rate_left_the_training_prevalence():
    assert not prediction_drift(18, 60, 0.27).drifted  # 30 % against 27 %: as expected
    flagged = prediction_drift(35, 60, 0.27)  # 58 %: the line or the model changed
    assert flagged.drifted and flagged.p_value < 1e-6 and flagged.rate_low > 0.27


@pytest.mark.parametrize(
    ("defects", "images", "prevalence", "message"),
    [
        (61, 60, 0.3, "defect_count <= images"),
        (0, 0, 0.3, "images >= 1"),
        (-1, 60, 0.3, "0 <= defect_count"),
        (5, 60, 0.0, "strictly between 0 and 1"),
        (5, 60, 1.0, "strictly between 0 and 1"),
    ],
)
def test_prediction_drift_refuses_impossible_counts(defects, images, prevalence, message):
    with pytest.raises(ValueError, match=message):
        prediction_drift(defects, images, prevalence)
    with pytest.raises(TypeError):
        prediction_drift(5.0, 60, 0.3)  # pyright: ignore[reportArgumentType]
