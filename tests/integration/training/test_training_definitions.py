"""The Dagster layer: image_features and trained_model materialized for real (Spark, TensorFlow, MLflow), the
promotion gate trained_model judges in its step, the retraining schedule and job, and the automation that follows
new raw_images batches."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import pytest
from support import training_data

from dgx_assets.defs.ingest.features import image_features
from dgx_assets.defs.model.checks import ModelGateSettings, evaluate_gate, model_gate_result
from dgx_assets.defs.model.schedules import build_retraining_schedule, retrain_job, retraining_schedule
from dgx_assets.defs.model.training import TRAINED_MODEL_CODE_VERSION, trained_model
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.lake.store import Lake
from dgx_assets.metadata import thresholds
from dgx_assets.partitions import image_batches

MODEL_NAME = "dagster_test_classifier"
BATCHES = ["b0", "b1"]
FEATURE_CONFIG = {"image_height": 32, "image_width": 32, "batch_rows": 32}


def _training_config(tmp: Path, **overrides) -> dict:
    return {"width": 8, "epochs": 4, "batch_size": 16, "patience": 4, "checkpoint_dir": str(tmp / "ckpt")} | overrides


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """A lake with two raw_images batches, a Dagster instance that knows them, and the real resources."""
    root = tmp_path_factory.mktemp("platform")
    for seed, batch in enumerate(BATCHES):
        rows = training_data.synthetic_raw_rows(150, batch, seed=seed)
        rows.loc[len(rows)] = training_data.raw_row(batch, "defective", "broken.png", b"junk", status="corrupted")
        training_data.commit_raw_batch(rows, root / "lake", batch)
    resources = {
        "spark": SparkResource(spark_conf=training_data.SPARK_TEST_CONF),
        "lake": LakeResource(root=str(root / "lake")),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{root}/mlflow.db", registered_model_name=MODEL_NAME),
    }
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, BATCHES)
        yield instance, resources, root


@pytest.fixture(scope="module")
def trained(platform):
    instance, resources, root = platform
    for batch in BATCHES:
        result = dg.materialize(
            [image_features],
            partition_key=batch,
            instance=instance,
            resources=resources,
            run_config={"ops": {"image_features": {"config": FEATURE_CONFIG}}},
        )
        assert result.success
    result = dg.materialize(
        [trained_model],
        instance=instance,
        resources=resources,
        run_config={"ops": {"trained_model": {"config": _training_config(root)}}},
    )
    assert result.success
    return result


def test_image_features_partition_metadata_and_files(platform, trained):
    instance, resources, root = platform
    event = instance.get_latest_materialization_event(dg.AssetKey("image_features"))
    metadata = event.asset_materialization.metadata
    assert event.asset_materialization.partition in BATCHES
    assert metadata["dagster/row_count"].value == 150  # valid raw rows only: the corrupted file stays behind
    assert metadata["tensor_shape"].value == [32, 32, 1] and metadata["devices"].value == ["cpu"]
    assert all(f"| {split} |" in metadata["split_counts"].value for split in ("train", "validation", "test"))
    columns = {c.name for c in metadata["dagster/column_schema"].value.columns}
    assert {"tensor", "tensor_shape", "brightness", "embedding", "feature_status"} <= columns
    # An Iceberg table: its metadata files, both batches in the catalog, the materialization names its snapshot.
    tables = Lake(str(root / "lake")).tables
    location = Path(tables.table("image_features").location().removeprefix("file://"))
    assert list((location / "metadata").glob("*.metadata.json"))
    assert tables.partitions("image_features") == BATCHES and metadata["table"].value == "dgx.image_features"
    snapshot = tables.snapshot("image_features", int(metadata["snapshot_id"].value))
    assert {uri.split("/batch=")[1].split("/")[0] for uri in snapshot.uris} <= set(BATCHES)


def test_trained_model_writes_the_contract_and_links_to_mlflow(platform, trained, monkeypatch):
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from dgx_assets import cli

    instance, resources, root = platform
    metadata = trained.asset_materializations_for_node("trained_model")[0].metadata
    info = json.loads((root / "lake" / "trained_model" / "model_info.json").read_text())
    assert (root / "lake" / "trained_model" / "model.keras").stat().st_size > 10_000
    assert info["class_names"] == ["defective", "functional"] and info["input_shape"] == [32, 32, 1]
    assert info["feature_partitions"] == BATCHES and len(info["feature_files"]) >= 2
    assert all(uri.startswith("file://") and "/dgx/image_features/data/batch=" in uri for uri in info["feature_files"])
    # Lineage: the run, its datasets and model_info name the image_features snapshot the model trained on, and
    # reading that snapshot gives back exactly the files it hashed.
    features = Lake(str(root / "lake")).tables.snapshot("image_features")
    assert info["feature_table"] == "dgx.image_features" and info["feature_snapshot_id"] == str(features.snapshot_id)
    assert sorted(info["feature_files"]) == sorted(features.uris)
    assert metadata["mlflow_run_id"].value == info["mlflow_run_id"]
    assert metadata["model_version"].value == f"{MODEL_NAME} v{info['model_version']} (alias candidate)"
    assert metadata["test_accuracy"].value == float(f"{info['test_metrics']['accuracy']:.4g}")  # 4 significant digits
    assert metadata["confusion_matrix"].value.startswith("| true \\ predicted | defective | functional |")
    assert metadata["mlflow_run"].value.startswith("http://127.0.0.1:5000/#/experiments/")  # a page a browser opens
    version_page = f"/#/models/{MODEL_NAME}/versions/{info['model_version']}?workflowType=machine_learning"
    assert metadata["mlflow_model_version"].value.endswith(version_page)  # in MLflow's model-training view

    client = MlflowClient(resources["mlflow"].tracking_config().tracking_uri)
    run = client.get_run(info["mlflow_run_id"])
    assert run.data.tags["dagster.run_id"] == trained.run_id
    assert run.data.tags["dagster.partition_keys"] == "b0,b1"
    assert run.data.tags["dagster.code_version"] == TRAINED_MODEL_CODE_VERSION
    assert run.data.tags["dgx.table"] == "dgx.image_features"
    assert run.data.tags["dgx.snapshot_id"] == str(features.snapshot_id)
    sources = [json.loads(entry.dataset.source) for entry in run.inputs.dataset_inputs]
    assert sources and all(source["snapshot_id"] == str(features.snapshot_id) for source in sources)
    assert metadata["image_features_snapshot_id"].value == str(features.snapshot_id)
    assert metadata["used_searched_hyperparameters"].value is False and "searched_hyperparameters" not in metadata
    # The documented command rebuilds the training set from the run alone: the same rows as the snapshot's files.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", resources["mlflow"].tracking_config().tracking_uri)
    out = root / "training-set.parquet"
    lake_args = ["lake", "--lake", str(root / "lake")]
    assert cli.main([*lake_args, "export", "--mlflow-run", info["mlflow_run_id"], "--out", str(out), "--columns", "sha256"]) == 0
    assert sorted(pq.read_table(out).column("sha256").to_pylist()) == sorted(
        features.dataset().to_table(columns=["sha256"]).column("sha256").to_pylist()
    )
    assert str(client.get_model_version_by_alias(MODEL_NAME, "candidate").version) == info["model_version"]

    evaluation = trained.get_asset_check_evaluations()[0]
    assert evaluation.check_name == "beats_baseline_and_champion" and evaluation.passed
    assert "no champion yet" in evaluation.description


def _run_gate(platform, **config) -> dg.AssetCheckResult:
    """The gate on the version `trained` registered, judged again with other settings (no retraining)."""
    instance, resources, root = platform
    info = json.loads((root / "lake" / "trained_model" / "model_info.json").read_text())
    return model_gate_result(info, resources["mlflow"].tracking_config().tracking_uri, ModelGateSettings(**config))


def test_gate_fails_a_model_that_does_not_beat_guessing_by_the_margin(platform, trained):
    evaluation = _run_gate(platform, min_margin_over_baseline=1.0)
    assert not evaluation.passed and "majority baseline" in evaluation.description
    assert "Train a better model" in evaluation.metadata["to_fix"].value
    assert evaluation.metadata["min_margin_over_baseline"].value == 1.0
    # The figure and the accuracy it had to reach, as the report and champion_model read any gated figure.
    found = thresholds(evaluation.metadata)
    baseline = evaluation.metadata["majority_baseline_accuracy"].value
    assert [(name, bound) for name, _, bound, _ in found] == [("test_accuracy", "min")]
    assert found[0][3] == pytest.approx(baseline + 1.0, abs=1e-3) and found[0][1] < found[0][3]


def test_gate_compares_with_the_champion(platform, trained):
    from mlflow import MlflowClient

    instance, resources, root = platform
    client = MlflowClient(resources["mlflow"].tracking_config().tracking_uri)
    info = json.loads((root / "lake" / "trained_model" / "model_info.json").read_text())
    accuracy = info["test_metrics"]["accuracy"]
    # An earlier, stronger champion: the new model trails it by more than the tolerance.
    experiment = client.get_experiment_by_name("dgx_assets")
    run = client.create_run(experiment.experiment_id)
    client.log_metric(run.info.run_id, "test_accuracy", accuracy + 0.2)
    client.set_terminated(run.info.run_id)
    champion = client.create_model_version(MODEL_NAME, f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    client.set_registered_model_alias(MODEL_NAME, "champion", champion.version)
    try:
        evaluation = _run_gate(platform)
        assert not evaluation.passed and f"below champion v{champion.version}" in evaluation.description
        assert _run_gate(platform, champion_tolerance=0.25).passed
    finally:
        client.delete_registered_model_alias(MODEL_NAME, "champion")


def test_gate_rules():
    assert evaluate_gate(0.90, 0.70, None, "3", 0.02, 0.01).passed
    assert not evaluate_gate(0.71, 0.70, None, "3", 0.02, 0.01).passed
    assert evaluate_gate(0.90, 0.70, ("2", 0.905), "3", 0.02, 0.01).passed
    assert not evaluate_gate(0.90, 0.70, ("2", 0.95), "3", 0.02, 0.01).passed
    assert evaluate_gate(0.90, 0.70, ("3", 0.90), "3", 0.02, 0.0).passed  # the champion itself


def test_bad_training_settings_are_refused_naming_the_setting(platform, trained):
    """A wrong choice is refused with the run config, before a run starts; a figure out of its bounds fails the
    step at its start, in pydantic's words naming the field."""
    instance, resources, root = platform

    def materialize(**settings):
        run_config = {"ops": {"trained_model": {"config": _training_config(root, **settings)}}}
        return dg.materialize(
            [trained_model], instance=instance, resources=resources, raise_on_error=False, run_config=run_config
        )

    with pytest.raises(dg.DagsterInvalidConfigError, match=r"config:backbone not in enum type.*got vgg99"):
        materialize(backbone="vgg99")
    result = materialize(learning_rate=0.0)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "learning_rate" in failure.step_failure_data.error.cause.message
    assert "greater than 0" in failure.step_failure_data.error.cause.message


def test_a_failing_gate_is_recorded_and_does_not_fail_the_step(platform, trained):
    """Held back, not failed: the step succeeds and the check, judged in the step on this materialization, says
    why. After the tests that read `trained`'s model: this run replaces it, as the two after it do."""
    instance, resources, root = platform
    config = _training_config(root, epochs=1, min_margin_over_baseline=1.0)
    result = dg.materialize(
        [trained_model], instance=instance, resources=resources, run_config={"ops": {"trained_model": {"config": config}}}
    )
    assert result.success
    evaluation = result.get_asset_check_evaluations()[0]
    assert evaluation.check_name == "beats_baseline_and_champion" and not evaluation.passed
    assert (
        evaluation.target_materialization_data.storage_id
        == instance.fetch_materializations(dg.AssetKey("trained_model"), limit=1).records[0].storage_id
    )


def test_trained_model_says_when_it_took_the_searched_hyperparameters(platform, trained):
    from mlflow import MlflowClient

    from dgx_assets.tuning.best_config import write_best_config

    instance, resources, root = platform
    best = {"learning_rate": 0.00123, "dropout": 0.125, "batch_size": 8}
    write_best_config(Lake(str(root / "lake")), best, {"mlflow_run_id": "search-run-1"})
    try:
        result = dg.materialize(
            [trained_model],
            instance=instance,
            resources=resources,
            run_config={
                "ops": {"trained_model": {"config": _training_config(root, epochs=1, use_searched_hyperparameters=True)}}
            },
        )
    finally:
        import shutil

        shutil.rmtree(root / "lake" / "hyperparameter_search")
    assert result.success
    metadata = result.asset_materializations_for_node("trained_model")[0].metadata
    assert metadata["used_searched_hyperparameters"].value is True
    assert metadata["searched_hyperparameters"].value == best
    assert metadata["hyperparameter_search_mlflow_run_id"].value == "search-run-1"
    params = MlflowClient(resources["mlflow"].tracking_config().tracking_uri).get_run(metadata["mlflow_run_id"].value).data.params
    assert (float(params["learning_rate"]), float(params["dropout"]), int(params["batch_size"])) == (0.00123, 0.125, 8)


def test_trained_model_trains_on_spark_barrier_tasks_with_distribution_spark(platform, trained):
    from mlflow import MlflowClient

    instance, resources, root = platform
    result = dg.materialize(
        [trained_model],
        instance=instance,
        resources=resources,
        run_config={"ops": {"trained_model": {"config": _training_config(root, distribution="spark", epochs=1)}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("trained_model")[0].metadata
    assert metadata["strategy"].value.startswith("MultiWorkerMirroredStrategy x1")  # local[2]: one barrier task
    run = MlflowClient(resources["mlflow"].tracking_config().tracking_uri).get_run(metadata["mlflow_run_id"].value)
    assert run.data.params["distribution"] == "spark" and run.data.params["workers"] == "1"

    with pytest.raises(dg.DagsterInvalidConfigError, match=r"config:distribution not in enum type.*got mpi"):
        dg.materialize(
            [trained_model],
            instance=instance,
            resources=resources,
            run_config={"ops": {"trained_model": {"config": _training_config(root, distribution="mpi")}}},
        )


def test_definitions_load_and_the_retraining_job_validates():
    merged = dg.Definitions(
        assets=[image_features, trained_model],
        jobs=[retrain_job],
        resources={"spark": SparkResource(), "lake": LakeResource(), "mlflow": MlflowResource()},
    )
    dg.Definitions.validate_loadable(merged)
    job = merged.resolve_job_def("retrain_model")
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == {"trained_model"}
    run_config = {"ops": {"trained_model": {"config": {"epochs": 10, "backbone": "resnet50"}}}}
    assert dg.validate_run_config(job, run_config)
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(job, {"ops": {"trained_model": {"config": {"epochs": "many"}}}})
    assert image_features.op.tags == {} and "dagster-k8s/config" in trained_model.op.tags  # the GPU pod


def _schedule_from_env() -> dg.ScheduleDefinition:
    (schedule,) = retraining_schedule().schedules or []
    assert isinstance(schedule, dg.ScheduleDefinition)
    return schedule


def test_nightly_schedule_requests_one_run_per_tick(monkeypatch):
    schedule = _schedule_from_env()
    assert schedule.cron_schedule == "0 2 * * *" and schedule.job_name == "retrain_model"
    tick = dt.datetime(2026, 5, 4, 2, 0, tzinfo=dt.UTC)
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(instance=instance, scheduled_execution_time=tick)
        requests = schedule.evaluate_tick(context).run_requests
    assert len(requests) == 1 and requests[0].run_key == f"retrain-{tick.isoformat()}"
    assert requests[0].tags["dgx/trigger"] == "schedule"

    monkeypatch.setenv("DGX_RETRAIN_CRON", "30 1 * * 6")
    assert _schedule_from_env().cron_schedule == "30 1 * * 6"
    assert build_retraining_schedule("0 * * * *", "Europe/Berlin").execution_timezone == "Europe/Berlin"


def test_new_raw_images_batch_brings_its_features_up_to_date():
    defs = dg.Definitions(
        assets=[dg.AssetSpec("raw_images", partitions_def=image_batches), image_features],
        resources={"spark": SparkResource(), "lake": LakeResource()},
    )
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["b0", "b1"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0  # no raw data yet

        instance.report_runless_asset_event(dg.AssetMaterialization("raw_images", partition="b1"))
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert second.total_requested == 1
        assert second.get_requested_partitions(dg.AssetKey("image_features")) == {"b1"}
