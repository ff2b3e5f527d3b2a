"""challenger_model: real SparkXGBClassifier across two local Spark task slots, a real MLflow store."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from support.embedding_features import write_embedding_features

from dgx_assets.challenger import report
from dgx_assets.defs.model.challenger import challenger_model
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.lake.store import Lake

FAST = {"n_estimators": 40, "early_stopping_rounds": 5, "max_depth": 3}


@pytest.fixture
def stores(tmp_path):
    lake = tmp_path / "lake"
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return lake, tracking_uri


def _materialize(lake, tracking_uri, spark_resource, config=FAST):
    return dg.materialize(
        [challenger_model],
        resources={
            "spark": spark_resource,
            "lake": LakeResource(root=str(lake)),
            "mlflow": MlflowResource(tracking_uri=tracking_uri),
        },
        run_config=dg.RunConfig({"challenger_model": {"config": config}}),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_challenger_trains_on_executors_tracks_lineage_and_registers_its_own_model(stores, spark_resource):
    from mlflow import MlflowClient

    lake, tracking_uri = stores
    keys = write_embedding_features(lake)
    result = _materialize(lake, tracking_uri, spark_resource)
    assert result.success
    metadata = result.asset_materializations_for_node("challenger_model")[0].metadata
    assert metadata["test_accuracy"].value >= 0.85
    assert metadata["workers"].value == "2 on cpu"  # local[2]: one XGBoost worker per task slot
    assert metadata["test_images"].value == 2 * 24  # exactly the rows whose split is "test"

    client = MlflowClient(tracking_uri)
    version = client.get_model_version_by_alias("dgx_defect_challenger", "challenger")
    run = client.get_run(version.run_id)
    assert run.data.tags["dagster.run_id"] == result.run_id
    assert run.data.tags["dagster.partition_keys"] == ",".join(keys)
    assert run.data.tags["dgx.data_digest"] == version.tags["dgx.data_digest"]
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"image_features[train+validation]", "image_features[test]"}
    assert run.data.params["num_workers"] == "2" and run.data.params["train_images"] == str(2 * 84)
    assert 0 < run.data.metrics["test_accuracy_ci95_low"] < run.data.metrics["test_accuracy"]

    info = json.loads((lake / "challenger_model" / "model_info.json").read_text())
    assert info["model_version"] == str(version.version) and info["inference_ms_per_image"] > 0
    import xgboost

    booster = xgboost.Booster(model_file=str(lake / "challenger_model" / "model.ubj"))
    assert booster.num_features() == 16
    # The report's section reads what the asset really wrote.
    [row] = report.compare(Lake(str(lake)), None, None)["rows"]
    assert row["version"] == f"dgx_defect_challenger v{version.version}" and row["images"] == 48


def test_features_without_embeddings_fail_with_what_to_do(stores, spark_resource):
    lake, tracking_uri = stores
    write_embedding_features(lake, batches=1, embeddings=False)
    result = _materialize(lake, tracking_uri, spark_resource)
    assert not result.success
    failure = result.failure_data_for_node("challenger_model").error.message
    assert "embedding efficientnet_lite0" in failure


def test_bad_settings_are_refused_before_training(stores, spark_resource):
    lake, tracking_uri = stores
    write_embedding_features(lake, batches=1)
    result = _materialize(lake, tracking_uri, spark_resource, {"learning_rate": 0.0})
    assert not result.success
    cause = result.failure_data_for_node("challenger_model").error.cause
    assert cause is not None and "learning_rate" in cause.message and "greater than 0" in cause.message
