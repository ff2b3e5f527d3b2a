"""What a person sees in MLflow's UI after training: a model-training experiment (not the GenAI overview),
descriptions on the run, the registered model and its version with a link back to the Dagster run, and a
logged model that carries the final test metrics, not the first epoch's training accuracy."""

from __future__ import annotations

import pytest

from dgx_assets.tracking.lineage import DagsterLineage
from dgx_assets.tracking.store import EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT, TrackingConfig, ensure_experiment
from dgx_assets.training.config import TrainConfig
from dgx_assets.training.tracking import train_and_track

MODEL = "ui_defect_classifier"


@pytest.fixture(scope="module")
def tracked(feature_files, tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow_ui")
    tracking = TrackingConfig(
        tracking_uri=f"sqlite:///{store}/mlflow.db",
        experiment_name="ui_test",
        registered_model_name=MODEL,
        ui_url="http://mlflow.example:5000/",
        dagster_ui_url="http://dagster.example:3000",
    )
    lineage = DagsterLineage(run_id="feedc0de-1234", partition_keys=("b0", "b1"))
    config = TrainConfig(backbone="scratch", width=8, epochs=3, batch_size=16, patience=3)
    return train_and_track(feature_files, "file:///lake/image_features", config, tracking, str(store / "ckpt"), lineage), tracking


def test_experiment_opens_on_training_runs_even_when_it_existed_before(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    old = client.create_experiment("made_by_an_older_version")  # untagged, as older code left it
    assert ensure_experiment(client, "made_by_an_older_version", uri) == old
    tags = client.get_experiment(old).tags
    assert tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT == "custom_model_development"
    assert "trained_model" in tags["mlflow.note.content"]


def test_run_and_registered_model_describe_themselves_and_link_back_to_dagster(tracked):
    from mlflow import MlflowClient

    result, tracking = tracked
    client = MlflowClient(tracking.tracking_uri)
    run = client.get_run(result.run_id)
    dagster_run = "http://dagster.example:3000/runs/feedc0de-1234"
    assert run.data.tags["dagster.run_url"] == dagster_run
    description = run.data.tags["mlflow.note.content"]
    assert f"]({dagster_run})" in description and "Test accuracy" in description and "b0, b1" in description
    assert result.run_url == (
        f"http://mlflow.example:5000/#/experiments/{result.experiment_id}/runs/{result.run_id}?workflowType=machine_learning"
    )  # MLflow 3.17's UI: the model-training view

    version = client.get_model_version(MODEL, result.model_version)
    assert dagster_run in version.description and version.tags["dagster.run_url"] == dagster_run
    assert "champion" in client.get_registered_model(MODEL).description


def test_logged_model_carries_the_final_test_metrics(tracked):
    from mlflow import MlflowClient

    result, tracking = tracked
    client = MlflowClient(tracking.tracking_uri)
    model_id = client.get_run(result.run_id).outputs.model_outputs[0].model_id
    linked = {metric.key: metric.value for metric in client.get_logged_model(model_id).metrics}
    assert linked["test_accuracy"] == pytest.approx(result.training.test.metrics["accuracy"])
    assert "accuracy" not in linked and "loss" not in linked  # no epoch's training metrics
    assert "training_seconds" in linked


def test_roc_curve_is_drawn_for_the_class_an_inspector_hunts():
    from dgx_assets.training.figures import hunted_class

    assert hunted_class(["defective", "functional"], [1, 1, 0]) == 0
    assert hunted_class(["good", "scratched"], [0, 0, 0, 1]) == 1  # no `defective`: the rarer class
