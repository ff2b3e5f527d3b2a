"""The head warm start fits on stored embeddings only when they are the classifier's own backbone's: Lite2
embeddings for a Lite2 classifier, Lite0's for Lite0's. Both are 1,280 floats, so only their values tell."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
from support import training_data

from dgx_assets.training.config import EFFICIENTNET_LITE0, EFFICIENTNET_LITE2, FeatureConfig, TrainConfig
from dgx_assets.training.dataset import FeatureFiles, scan_features
from dgx_assets.training.model import build_classifier
from dgx_assets.training.train import warm_start_head


@pytest.fixture(scope="module")
def features_by_embedding(tmp_path_factory) -> dict[str, FeatureFiles]:
    """One image_features partition (100 synthetic 48 px cells -> 32x32 grey tensors) per Lite embedding."""
    files = {}
    for embedding in (EFFICIENTNET_LITE0, EFFICIENTNET_LITE2):
        root = tmp_path_factory.mktemp(embedding)
        config = FeatureConfig(image_height=32, image_width=32, embedding=embedding)
        paths = training_data.write_feature_partitions(root, config, rows_per_batch=100, batches=("b0",))
        files[embedding] = FeatureFiles(pafs.LocalFileSystem(), tuple(str(path) for path in paths))
    return files


@pytest.mark.parametrize("backbone", [EFFICIENTNET_LITE0, EFFICIENTNET_LITE2])
def test_the_head_starts_from_embeddings_of_the_same_backbone_only(features_by_embedding, backbone):
    other = EFFICIENTNET_LITE2 if backbone == EFFICIENTNET_LITE0 else EFFICIENTNET_LITE0
    config = TrainConfig.model_validate({"backbone": backbone}).resolved()
    assert config.warm_starts_head
    for embedding, files in features_by_embedding.items():
        index = scan_features(files)
        classifier = build_classifier(config, index.tensor_shape, len(index.class_names))
        start = warm_start_head(classifier, files, index, config)
        if embedding == backbone:
            assert start.used and start.reason.startswith("logistic regression on") and start.train_accuracy
        else:
            assert embedding == other and not start.used
            assert f"not this backbone's ({backbone};" in start.reason
            assert f"materialize image_features with embedding {backbone}" in start.reason
