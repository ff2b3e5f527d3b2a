"""The decision rule: the validation threshold and the dihedral views, on numbers built for each case."""

import numpy as np
import pytest

from dgx_assets.training.decision import (
    TEST_TIME_VIEWS,
    Decision,
    choose_threshold,
    decide,
    dihedral_views,
    positive_index,
    shrink_toward_half,
)


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


def test_a_shrunk_threshold_moves_that_fraction_of_the_way_back_to_one_half():
    assert shrink_toward_half(0.3, 0.0) == 0.3
    assert shrink_toward_half(0.3, 0.5) == pytest.approx(0.4)
    assert shrink_toward_half(0.62, 0.5) == pytest.approx(0.56)
    assert shrink_toward_half(0.27, 1.0) == 0.5
    with pytest.raises(ValueError, match="fraction from 0 to 1, got 1.5"):
        shrink_toward_half(0.3, 1.5)


def test_decide_applies_the_threshold_only_with_two_classes():
    probabilities = np.array([[0.4, 0.6], [0.7, 0.3]])
    assert decide(probabilities, None, 1).tolist() == [1, 0]
    assert decide(probabilities, 0.65, 1).tolist() == [0, 0]
    assert decide(probabilities, 0.65, None).tolist() == [1, 0]  # more than two classes: argmax


def test_the_dihedral_views_are_the_symmetries_of_a_square_in_groups():
    image = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    views = [tuple(view.ravel()) for view in dihedral_views(image)]
    assert len(set(views)) == 8
    turns = {tuple(np.rot90(image, k, axes=(1, 2)).ravel()) for k in range(4)}
    assert views[0] == tuple(image.ravel())
    assert set(tuple(v.ravel()) for v in dihedral_views(image, 4)) == turns
    assert [tuple(v.ravel()) for v in dihedral_views(image, 2)] == [views[0], tuple(image[:, :, ::-1].ravel())]
    # Each count is a group: composing two of its views gives a third, so no orientation counts twice.
    for count in TEST_TIME_VIEWS:
        group = {tuple(v.ravel()) for v in dihedral_views(image, count)}
        assert len(group) == count
        for view in dihedral_views(image, count):
            assert {tuple(v.ravel()) for v in dihedral_views(view, count)} == group


def test_views_other_than_a_group_and_quarter_turns_of_oblong_images_are_refused():
    oblong = np.zeros((1, 3, 4, 1))
    assert len(dihedral_views(oblong, 2)) == 2  # the mirror image needs no square
    for count in (4, 8):
        with pytest.raises(ValueError, match="square"):
            dihedral_views(oblong, count)
    with pytest.raises(ValueError, match="groups"):
        dihedral_views(oblong, 3)


def test_a_decision_round_trips_through_model_info():
    decision = Decision(views=4, threshold=0.58, positive_index=0)
    assert Decision.from_dict(decision.to_dict() | {"unknown": 1}) == decision
    assert Decision.from_dict(None) == Decision()
    # model_info.json of models trained before the count was a setting: a flag for all eight.
    assert Decision.from_dict({"tta": True, "threshold": 0.44, "positive_index": 0}).views == 8
