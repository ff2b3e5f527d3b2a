"""The parity gate's three criteria, each on predictions built so that only it decides."""

import numpy as np
import pytest

from dgx_assets.edge.parity import GateSettings, Predictions, compare, evaluate_gate


def predictions(p_positive: list[float]) -> Predictions:
    p = np.asarray(p_positive, dtype=np.float32)
    return Predictions(np.stack([1 - p, p], axis=1), np.array([0.001]))


def judged(keras: list[float], edge: list[float], labels: list[int], settings: GateSettings | None = None, **decision):
    report = compare(
        predictions(keras),
        predictions(edge),
        np.array(labels),
        quantization="int8",
        keras_size_bytes=10,
        tflite_size_bytes=3,
        **decision,
    )
    return report, evaluate_gate(report, settings or GateSettings())


def failed(gate) -> list[str]:
    return [c.name for c in gate.criteria if not c.passed]


# 100 images the Keras model gets right with P = 0.8 on the true class, unless a case changes some.
LABELS = [1] * 50 + [0] * 50
CONFIDENT = [0.8] * 50 + [0.2] * 50


def test_an_edge_model_that_decides_like_keras_passes_every_criterion():
    report, gate = judged(CONFIDENT, [p + 0.05 for p in CONFIDENT], LABELS)
    assert gate.passed and failed(gate) == [] and report.top1_agreement == 1.0
    assert [c.name for c in gate.criteria] == ["accuracy_drop_points", "negative_flip_rate", "confident_disagreements"]


def test_accuracy_lost_beyond_the_allowed_drop_fails():
    keras = [0.55] * 3 + CONFIDENT[3:]  # three right but barely (margin 0.1)
    edge = [0.45] * 3 + CONFIDENT[3:]
    report, gate = judged(keras, edge, LABELS, GateSettings(max_negative_flip_rate=0.05))
    assert report.keras_accuracy - report.tflite_accuracy == pytest.approx(0.03)
    assert failed(gate) == ["accuracy_drop_points"]
    assert "3.00 points below trained_model's" in gate.reasons[0]


def test_negative_flips_fail_even_when_positive_flips_keep_accuracy():
    # Three images Keras gets wrong near the boundary become right, three it gets right become wrong: accuracy
    # holds, but three of 100 regressed.
    keras = [0.55, 0.55, 0.55, 0.45, 0.45, 0.45] + CONFIDENT[6:]
    edge = [0.45, 0.45, 0.45, 0.55, 0.55, 0.55] + CONFIDENT[6:]
    labels = [1, 1, 1, 1, 1, 1] + LABELS[6:]
    report, gate = judged(keras, edge, labels)
    assert report.keras_accuracy == report.tflite_accuracy
    assert (report.negative_flips, report.positive_flips) == (3, 3)
    assert failed(gate) == ["negative_flip_rate"]


def test_a_disagreement_on_a_confident_image_fails_alone():
    # A broken conversion flips an image Keras is sure of (P = 0.99): one image, so accuracy and flips are within limits.
    keras = [0.99] + CONFIDENT[1:]
    edge = [0.3] + CONFIDENT[1:]
    report, gate = judged(keras, edge, LABELS)
    assert report.disagreements == 1 and report.disagreement_margins == [pytest.approx(0.98)]
    assert failed(gate) == ["confident_disagreements"]
    relaxed = evaluate_gate(report, GateSettings(confident_margin=0.99))
    assert relaxed.passed


def test_decisions_are_judged_at_the_models_threshold():
    # At threshold 0.7, P = 0.65 is "negative" for both: no disagreement although argmax would differ.
    keras = [0.65] + CONFIDENT[1:]
    edge = [0.66] + CONFIDENT[1:]
    report, _ = judged(keras, edge, [0] + LABELS[1:], threshold=0.7, positive=1)
    assert report.disagreements == 0 and report.threshold == 0.7
    report, _ = judged([0.69] + CONFIDENT[1:], [0.71] + CONFIDENT[1:], [0] + LABELS[1:], threshold=0.7, positive=1)
    assert report.disagreements == 1 and report.negative_flips == 1
    assert report.disagreement_margins == [pytest.approx(0.02)]


@pytest.mark.parametrize("settings", [{"max_accuracy_drop_points": -1}, {"max_negative_flip_rate": 1.5}, {"confident_margin": 0}])
def test_impossible_thresholds_are_refused_with_the_setting_named(settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        GateSettings(**settings)
