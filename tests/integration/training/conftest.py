"""Fixtures for the training domain: a local SparkSession and small raw_images partitions."""

from __future__ import annotations

import pandas as pd
import pytest
from support import training_data


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("dgx-training-tests")
    for key, value in training_data.SPARK_TEST_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def elpv_sample() -> pd.DataFrame:
    """40 real ELPV cells (PNG bytes), labelled functional / defective."""
    return training_data.elpv_raw_rows(count=40, batch="elpv-sample")


@pytest.fixture(scope="session")
def feature_files(tmp_path_factory):
    """Two image_features partitions (300 synthetic 48px cells -> 32x32 tensors), as the training input."""
    import pyarrow.fs as pafs

    from dgx_assets.training.config import FeatureConfig
    from dgx_assets.training.dataset import FeatureFiles

    root = tmp_path_factory.mktemp("lake") / "image_features"
    paths = training_data.write_feature_partitions(root, FeatureConfig(image_height=32, image_width=32), rows_per_batch=150)
    return FeatureFiles(pafs.LocalFileSystem(), tuple(str(p) for p in paths))


@pytest.fixture
def small_train_config():
    from dgx_assets.training.config import TrainConfig

    # The small from-scratch CNN: these tests are about the training machinery, not the backbone.
    return TrainConfig(backbone="scratch", width=8, epochs=4, batch_size=16, patience=4)
