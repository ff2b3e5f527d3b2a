"""Training on image_features files: streaming, class weights, determinism, resume after interruption."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from dgx_assets.training.config import ModelConfigError, TrainConfig
from dgx_assets.training.dataset import FeatureDataError, FeatureFiles, make_dataset, scan_features
from dgx_assets.training.model import single_view
from dgx_assets.training.train import (
    choose_decision,
    classification_report,
    train_classifier,
    training_datasets,
)


def test_scan_counts_classes_and_splits_from_small_columns(feature_files):
    index = scan_features(feature_files)

    assert index.class_names == ("defective", "functional") and index.tensor_shape == (32, 32, 1)
    assert sum(index.rows(s) for s in ("train", "validation", "test")) == 300
    weights = index.class_weights()
    defective, functional = index.label_counts("train")
    assert defective < functional and weights[0] > 1.0 > weights[1]  # the rarer class weighs more
    assert weights[0] * defective == pytest.approx(weights[1] * functional)


def test_dataset_streams_every_row_of_a_split_once(feature_files):
    index = scan_features(feature_files)
    seen = []
    for images, labels in make_dataset(feature_files, index, "validation", batch_size=7):
        assert images.dtype.name == "float32" and images.shape[1:] == (32, 32, 1)
        assert 0.0 <= float(images.numpy().min()) and float(images.numpy().max()) <= 255.0
        seen.extend(labels.numpy().tolist())
    assert len(seen) == index.rows("validation")
    assert np.bincount(seen, minlength=2).tolist() == index.label_counts("validation")


def test_mixed_tensor_shapes_are_refused(feature_files, tmp_path):
    from support import training_data

    from dgx_assets.training.config import FeatureConfig

    other = training_data.write_feature_partitions(tmp_path, FeatureConfig(image_height=40, image_width=40), 30, ("b9",))
    mixed = FeatureFiles(feature_files.filesystem, feature_files.paths + (str(other[0]),))
    with pytest.raises(FeatureDataError, match="different shapes"):
        scan_features(mixed)


def test_training_is_deterministic_and_beats_the_majority_baseline(feature_files, small_train_config, tmp_path):
    first = train_classifier(feature_files, small_train_config, str(tmp_path / "ckpt-a"))
    second = train_classifier(feature_files, small_train_config, str(tmp_path / "ckpt-b"))

    assert first.test.metrics == second.test.metrics  # same data + config -> same numbers
    assert first.strategy == "MirroredStrategy" and first.replicas == 1 and first.precision_policy == "float32"
    assert first.epochs == [0, 1, 2, 3] and first.resumed_from_epoch == 0
    # Each epoch is one pass over the training split, though Keras reads it from one repeated dataset.
    passes = math.ceil(scan_features(feature_files).rows("train") / small_train_config.batch_size)
    assert int(single_view(first.model).optimizer.iterations.numpy()) == 4 * passes
    metrics = first.test.metrics
    assert metrics["accuracy"] > metrics["majority_baseline_accuracy"]
    assert 0.5 < metrics["roc_auc"] <= 1.0
    assert set(metrics) >= {"precision_defective", "recall_functional", "f1_defective", "macro_f1"}
    assert np.asarray(first.test.confusion_matrix).sum() == scan_features(feature_files).rows("test")


class _SpotNodeReclaimed(RuntimeError):
    pass


class _InterruptAfter(keras.callbacks.Callback):
    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise _SpotNodeReclaimed(f"node reclaimed after epoch {epoch}")


def test_interrupted_training_resumes_from_the_last_finished_epoch(feature_files, small_train_config, tmp_path):
    checkpoints = str(tmp_path / "ckpt")
    config = small_train_config.model_copy(update={"epochs": 4, "patience": 4})
    with pytest.raises(_SpotNodeReclaimed):
        train_classifier(feature_files, config, checkpoints, extra_callbacks=[_InterruptAfter(epoch=1)])

    resumed = train_classifier(feature_files, config, checkpoints)

    assert resumed.resumed_from_epoch == 2 and resumed.epochs == [2, 3]
    assert len(resumed.history["loss"]) == 2
    # A finished run removes its checkpoint: the next run starts fresh.
    assert not list((tmp_path / "ckpt").glob("**/*.keras")) and not list((tmp_path / "ckpt").glob("**/*.json"))


def test_bad_training_settings_name_the_setting(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="backbone\n.*'efficientnet_lite0'"):
        TrainConfig(backbone="vgg99")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="weights_path\n.*does not exist"):
        TrainConfig(weights_path=str(tmp_path / "missing.weights.h5"))
    with pytest.raises(ValidationError, match="learning_rate\n.*greater than 0"):
        TrainConfig(learning_rate=0)
    with pytest.raises(ValidationError, match="schedule\n.*cosine, plateau"):
        TrainConfig(schedule="linear")
    with pytest.raises(ValidationError, match="label_smoothing\n.*less than 1"):
        TrainConfig(label_smoothing=1.0)
    with pytest.raises(ValidationError, match="balanced_sampling and class_weighting both"):
        TrainConfig(balanced_sampling=True, class_weighting=True)
    # A recipe that weights classes (the scratch CNN's) gives way to the sampling.
    assert TrainConfig(backbone="scratch").resolved().class_weighting
    assert not TrainConfig(backbone="scratch", balanced_sampling=True).resolved().class_weighting


def test_balanced_sampling_trains_on_an_equal_class_stream(feature_files, small_train_config, tmp_path):
    config = small_train_config.model_copy(update={"balanced_sampling": True})
    result = train_classifier(feature_files, config, str(tmp_path / "ckpt"))

    assert set(result.class_weights.values()) == {1.0} and result.epochs == [0, 1, 2, 3]  # no weights on top
    assert result.test.metrics["accuracy"] > result.test.metrics["majority_baseline_accuracy"]


def test_label_smoothing_trains_on_smoothed_one_hot_targets(feature_files, small_train_config, tmp_path):
    index = scan_features(feature_files)
    smoothing = 0.2
    config = small_train_config.model_copy(update={"label_smoothing": smoothing}).resolved()
    _, validation_data = training_datasets(feature_files, index, config, 16)
    images, targets = (np.concatenate(parts) for parts in zip(*((x.numpy(), y.numpy()) for x, y in validation_data)))
    assert targets.shape == (index.rows("validation"), 2) and set(np.unique(targets)) == {0.0, 1.0}
    assert np.bincount(targets.argmax(axis=1), minlength=2).tolist() == index.label_counts("validation")

    result = train_classifier(feature_files, config, str(tmp_path / "ckpt"))
    assert result.test.metrics["accuracy"] > result.test.metrics["majority_baseline_accuracy"]

    # The loss it trained on is cross-entropy against 1 - s/2 on the true class and s/2 on the other.
    model = single_view(result.model)
    probabilities = np.clip(model.predict(images, verbose=0), 1e-7, 1.0)
    smoothed = targets * (1 - smoothing) + smoothing / 2
    expected = float(np.mean(-(smoothed * np.log(probabilities)).sum(axis=1)))
    plain = float(np.mean(-(targets * np.log(probabilities)).sum(axis=1)))
    loss = model.evaluate(validation_data, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(expected, rel=1e-4) and abs(expected - plain) > 1e-2


def test_weights_file_initialises_the_backbone(feature_files, tmp_path):
    from dgx_assets.training.config import ModelConfig
    from dgx_assets.training.model import build_backbone

    donor = build_backbone(ModelConfig(backbone="scratch", width=8), (32, 32, 1))
    donor.set_weights([w + 0.5 for w in donor.get_weights()])
    path = tmp_path / "backbone.weights.h5"
    donor.save_weights(path)

    loaded = build_backbone(ModelConfig(backbone="scratch", width=8, weights_path=str(path)), (32, 32, 1))
    assert all(np.array_equal(a, b) for a, b in zip(donor.get_weights(), loaded.get_weights()))


def test_report_on_known_predictions():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    report = classification_report(np.array([0, 1, 1, 1]), probabilities, ["bad", "good"], train_label_counts=[1, 9])

    assert report.metrics["accuracy"] == 0.75 and report.metrics["majority_baseline_accuracy"] == 0.75
    assert report.metrics["recall_good"] == pytest.approx(2 / 3) and report.metrics["precision_bad"] == 0.5
    assert report.metrics["roc_auc"] == 1.0
    assert report.confusion_matrix == [[1, 0], [1, 2]]


@pytest.mark.parametrize("height, width, views", [(16, 16, 2), (16, 16, 4), (12, 16, 2)])
def test_the_views_in_the_graph_are_the_numpy_views(height, width, views):
    from dgx_assets.training import decision
    from dgx_assets.training.model import build_classifier, with_dihedral_views

    classifier = build_classifier(TrainConfig(backbone="scratch", width=4).model, (height, width, 1), num_classes=2)
    model = with_dihedral_views(classifier, views)
    images = np.random.default_rng(1).uniform(0, 255, (3, height, width, 1)).astype("float32")
    expected = decision.predict(classifier, images, views=views)
    np.testing.assert_allclose(model.predict(images, verbose=0), expected, atol=1e-5)
    assert with_dihedral_views(classifier, 1) is classifier


def test_quarter_turns_of_oblong_inputs_are_refused():
    from dgx_assets.training.model import build_classifier, with_dihedral_views

    classifier = build_classifier(TrainConfig(backbone="scratch", width=4).model, (12, 16, 1), num_classes=2)
    for views in (4, 8):
        with pytest.raises(ModelConfigError, match="square"):
            with_dihedral_views(classifier, views)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="test_time_views"):
        TrainConfig(test_time_views=3)


def test_the_decision_rule_is_chosen_on_validation_and_travels_with_the_saved_model(feature_files, small_train_config, tmp_path):
    from dgx_assets.edge.convert import EdgeConversionConfig, convert_to_tflite
    from dgx_assets.training import decision
    from dgx_assets.training.model import single_view

    config = small_train_config.model_copy(update={"test_time_views": 8, "tune_threshold": True, "threshold_shrinkage": 0.0})
    result = train_classifier(feature_files, config, str(tmp_path / "ckpt"))
    assert result.decision.views == 8 and result.decision.positive_index == 0  # "defective"
    assert 0.0 < result.decision.threshold < 1.0
    # Shrinkage moves the validation's choice toward 0.5 by the fraction set; all of it is 0.5 itself.
    index = scan_features(feature_files)
    for shrinkage in (0.5, 1.0):
        shrunk = choose_decision(
            result.model, feature_files, index, config.model_copy(update={"threshold_shrinkage": shrinkage}), 32
        )
        assert shrunk.threshold == pytest.approx(result.decision.threshold + shrinkage * (0.5 - result.decision.threshold))

    # The dihedral views live in the graph: the saved file is plain Keras and averages exactly what the
    # numpy views of the one-view classifier give.
    images = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 1)).astype("float32")
    expected = decision.predict(single_view(result.model), images, views=8)
    result.model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", compile=False)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, atol=1e-5)
    assert single_view(loaded) is not loaded and single_view(single_view(loaded)) is single_view(loaded)

    # Test metrics are the thresholded decisions of the views model.
    labels, probabilities = result.test.labels, result.test.probabilities
    decided = decision.decide(probabilities, result.decision.threshold, 0)
    assert result.test.metrics["accuracy"] == pytest.approx(float(np.mean(decided == labels)))

    # And the edge model converts the views with plain TFLite ops.
    tflite = convert_to_tflite(loaded, EdgeConversionConfig(raw_height=32, raw_width=32, quantization="float32"))
    assert len(tflite) > 0
