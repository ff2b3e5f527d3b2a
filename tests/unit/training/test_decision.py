"""The decision rule: the validation threshold and the dihedral views, on numbers built for each case."""

import numpy as np
import pytest

from dgx_assets.training.decision import Decision, choose_threshold, decide, dihedral_views, positive_index


def test_the_positive_class_is_defective_or_the_second_of_two():
    assert positive_index(["defective", "functional"]) == 0
    assert positive_index(["bad", "good"]) == 1
    assert positive_index(["a", "b", "c"]) is None


def test_the_threshold_is_the_most_accurate_on_validation_and_ties_go_to_one_half():
    # Positives score 0.62..0.9, negatives 0.1..0.55: any threshold in (0.55, 0.62] separates them.
    scores = np.array([0.62, 0.7, 0.9, 0.1, 0.3, 0.55])
    labels = np.array([1, 1, 1, 0, 0, 0])
    probabilities = np.stack([1 - scores, scores], axis=1)
    assert choose_threshold(labels, probabilities, positive=1) == pytest.approx(0.56)
    # Already separable at 0.5: the evidence does not move it.
    assert choose_threshold(labels, np.stack([1 - scores + 0.0, np.clip(scores - 0.06, 0, 1)], axis=1), 1) == 0.5


def test_decide_applies_the_threshold_only_with_two_classes():
    probabilities = np.array([[0.4, 0.6], [0.7, 0.3]])
    assert decide(probabilities, None, 1).tolist() == [1, 0]
    assert decide(probabilities, 0.65, 1).tolist() == [0, 0]
    assert decide(probabilities, 0.65, None).tolist() == [1, 0]  # more than two classes: argmax


def test_the_dihedral_views_are_the_eight_symmetries_of_a_square():
    image = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    views = {tuple(view.ravel()) for view in dihedral_views(image)}
    assert len(views) == 8
    assert tuple(image.ravel()) in views and tuple(image[:, ::-1, ::-1].ravel()) in views
    assert len(dihedral_views(np.zeros((1, 3, 4, 1)))) == 4  # not square: flips only


def test_a_decision_round_trips_through_model_info():
    decision = Decision(tta=True, threshold=0.58, positive_index=0)
    assert Decision.from_dict(decision.to_dict() | {"unknown": 1}) == decision
    assert Decision.from_dict(None) == Decision()
