"""The diversity measure of generated images, on vectors whose distances are known."""

import numpy as np
import pytest

from dgx_assets.generation.diversity import MIN_MEAN_DISTANCE, pairwise_diversity


def test_identical_vectors_are_near_duplicates_and_orthogonal_ones_are_not():
    same = pairwise_diversity(["a", "b", "c"], np.ones((3, 4)))
    assert same.mean_distance == pytest.approx(0.0, abs=1e-12) and same.near_duplicates()
    apart = pairwise_diversity(["a", "b", "c"], np.eye(3))
    assert apart.mean_distance == pytest.approx(1.0) and not apart.near_duplicates()


def test_the_closest_pairs_come_first_and_the_threshold_is_configurable():
    vectors = np.array([[1.0, 0.0], [0.99, 0.141], [0.0, 1.0]])  # a and b almost the same direction, c apart
    diversity = pairwise_diversity(["a", "b", "c"], vectors, closest=2)
    assert [pair[:2] for pair in diversity.closest] == [("a", "b"), ("b", "c")]
    assert diversity.closest[0][2] == pytest.approx(1 - 0.99 / np.hypot(0.99, 0.141), abs=1e-4)
    assert diversity.near_duplicates(min_mean_distance=0.9) and not diversity.near_duplicates(MIN_MEAN_DISTANCE)


def test_fewer_than_two_images_or_mismatched_vectors_are_refused():
    with pytest.raises(ValueError, match="at least two images"):
        pairwise_diversity(["a"], np.ones((1, 3)))
    with pytest.raises(ValueError, match="at least two images"):
        pairwise_diversity(["a", "b"], np.ones((3, 3)))
