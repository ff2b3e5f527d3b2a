"""Fixtures for the training domain: a local SparkSession and small raw_images partitions."""

from __future__ import annotations

import pandas as pd
import pytest

import training_data


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dgx-training-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def elpv_sample() -> pd.DataFrame:
    """40 real ELPV cells (PNG bytes), labelled functional / defective."""
    return training_data.elpv_raw_rows(count=40, batch="elpv-sample")
