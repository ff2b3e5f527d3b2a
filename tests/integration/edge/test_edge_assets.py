"""edge_model and its blocking parity check in a real Dagster instance, with the lake and MLflow resources.

trained_model (issue 3) is stood in for by a small asset that writes exactly what its contract says —
`<lake>/trained_model/model.keras`, `model_info.json`, an MLflow run and a registered version — plus a
blocking check whose verdict the test chooses. raw_images and image_features rows are written per
the table layout of docs/architecture.md.
"""

import json

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.edge_data import CLASS_NAMES, RAW_SIZE, features_like_image_features

from dgx_assets.edge.definitions import defs as edge_defs
from dgx_assets.resources import LakeResource, MlflowResource

MODEL_NAME = "dgx_defect_classifier"


class StandInCheckConfig(dg.Config):
    passes: bool = True


def stand_in_trained_model(model_path):
    @dg.asset(name="trained_model")
    def trained_model(lake: LakeResource, mlflow: MlflowResource) -> None:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=mlflow.resolved_tracking_uri)
        experiment = client.get_experiment_by_name(mlflow.experiment_name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(mlflow.experiment_name)
        run = client.create_run(experiment_id)
        client.set_terminated(run.info.run_id)
        if not client.search_registered_models(f"name='{mlflow.registered_model_name}'"):
            client.create_registered_model(mlflow.registered_model_name)
        version = client.create_model_version(
            mlflow.registered_model_name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id
        ).version
        client.set_registered_model_alias(mlflow.registered_model_name, "candidate", version)
        store = lake.lake
        base = store.asset_uri("trained_model")
        store.write_bytes(f"{base}/model.keras", model_path.read_bytes())
        info = {
            "class_names": CLASS_NAMES,
            "input_shape": [None, 24, 24, 1],
            "mlflow_run_id": run.info.run_id,
            "registered_model_name": mlflow.registered_model_name,
            "model_version": str(version),
            "test_metrics": {"accuracy": 1.0},
            "feature_files": store.data_files(store.asset_uri("image_features")),
        }
        store.write_bytes(f"{base}/model_info.json", json.dumps(info).encode())

    @dg.asset_check(asset=trained_model, blocking=True)
    def beats_baseline(config: StandInCheckConfig) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=config.passes)

    return trained_model, beats_baseline


def write_tables(lake_root, dataset) -> None:
    """One batch of raw_images and image_features rows for the fixture images."""
    import hashlib
    import io

    from PIL import Image

    sha = [hashlib.sha256(content).hexdigest() for content in dataset.contents]
    sizes = [Image.open(io.BytesIO(content)).size for content in dataset.contents]
    raw = pa.table(
        {
            "sha256": sha,
            "label": dataset.labels,
            "split": dataset.splits,
            "status": ["valid"] * len(sha),
            "width": [w for w, _ in sizes],
            "height": [h for _, h in sizes],
            "content": dataset.contents,
        }
    )
    tensors = features_like_image_features(dataset.contents)
    features = pa.table(
        {
            "sha256": sha,
            "label": dataset.labels,
            "split": dataset.splits,
            "feature_status": ["ok"] * len(sha),
            "tensor": [t.tobytes() for t in tensors],
            "tensor_shape": [list(t.shape) for t in tensors],
        }
    )
    for name, table in (("raw_images", raw), ("image_features", features)):
        folder = lake_root / name / "batch=b1"
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "part-0.parquet")


@pytest.fixture
def edge_env(tmp_path, edge_dataset, trained_classifier):
    write_tables(tmp_path / "lake", edge_dataset)
    resources = {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
    }
    trained_model, beats_baseline = stand_in_trained_model(trained_classifier.path)
    with dg.instance_for_test() as instance:
        yield {
            "assets": [trained_model, beats_baseline, *edge_defs.assets, *edge_defs.asset_checks],
            "resources": resources,
            "instance": instance,
            "lake": tmp_path / "lake",
            "tracking_uri": resources["mlflow"].tracking_uri,
        }


def run(env, selection=None, trained_passes=True, edge_config=None, gate_config=None):
    run_config = {"ops": {}}
    if selection is None:
        run_config["ops"]["trained_model_beats_baseline"] = {"config": {"passes": trained_passes}}
    if edge_config:
        run_config["ops"]["edge_model"] = {"config": edge_config}
    if gate_config:
        run_config["ops"]["edge_model_parity"] = {"config": gate_config}
    # Through a Definitions' asset job, as the webserver and daemon launch it (a repository is set).
    assets = [a for a in env["assets"] if not isinstance(a, dg.AssetChecksDefinition)]
    checks = [a for a in env["assets"] if isinstance(a, dg.AssetChecksDefinition)]
    job = dg.Definitions(assets=assets, asset_checks=checks, resources=env["resources"]).resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=env["instance"],
        run_config=run_config,
        raise_on_error=False,
        asset_selection=[dg.AssetKey(key) for key in selection] if selection else None,
    )


def champion(env):
    from mlflow import MlflowClient

    from dgx_assets.tracking.registry import current_alias_version

    return current_alias_version(MlflowClient(tracking_uri=env["tracking_uri"]), MODEL_NAME)


def check_result(result, name):
    evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    assert len(evaluations) == 1, [e.check_name for e in evaluations]
    return evaluations[0]


def materialized(result, name):
    return bool(result.asset_materializations_for_node(name))


def test_edge_model_materializes_logs_to_mlflow_and_champion_model_promotes_when_both_gates_pass(edge_env):
    from mlflow import MlflowClient

    result = run(edge_env)
    assert result.success
    metadata = result.asset_materializations_for_node("edge_model")[0].metadata
    assert metadata["top1_agreement"].value >= 0.99 and metadata["test_images"].value == 100
    assert metadata["size_ratio"].value < 1 and metadata["tflite_latency_ms"].value > 0
    assert f"[1, {RAW_SIZE}, {RAW_SIZE}, 1]" in metadata["raw_input"].value
    assert metadata["feature_source"].value == "the image_features files trained_model used"

    edge_dir = edge_env["lake"] / "edge_model"
    assert {p.name for p in edge_dir.iterdir()} == {"model.tflite", "edge_model.json", "parity.json", "parity.png", "triton"}
    contract = json.loads((edge_dir / "edge_model.json").read_text())
    assert (contract["raw_height"], contract["raw_width"], contract["input_dtype"]) == (RAW_SIZE, RAW_SIZE, "uint8")
    assert (edge_dir / "triton" / "defect_classifier" / "1" / "model.savedmodel" / "saved_model.pb").is_file()

    # The .tflite in the lake runs, in ai_edge_litert, on a raw image.
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(edge_dir / "model.tflite")).get_signature_runner("serving_default")
    probabilities = runner(image=np.full((1, RAW_SIZE, RAW_SIZE, 1), 140, np.uint8))["probabilities"]
    assert probabilities.shape == (1, 2)

    assert check_result(result, "parity").passed
    client = MlflowClient(tracking_uri=edge_env["tracking_uri"])
    run_id = metadata["mlflow_run_id"].value
    artifacts = {a.path for a in client.list_artifacts(run_id, "edge_model")}
    assert {"edge_model/model.tflite", "edge_model/parity.png", "edge_model/parity.json"} <= artifacts
    mlflow_run = client.get_run(run_id)
    assert mlflow_run.data.metrics["edge_top1_agreement"] >= 0.99

    # The promotion is champion_model's materialization, not a side effect of the check.
    promotion = result.asset_materializations_for_node("champion_model")[0].metadata
    assert promotion["model_version"].value == f"{MODEL_NAME} v1" and promotion["previous_champion"].value == "none"
    assert "beats_baseline passed" in promotion["gates"].value and "parity passed" in promotion["gates"].value
    assert mlflow_run.data.tags["dgx.promotion"] == "champion (version 1)"
    assert client.get_model_version(MODEL_NAME, "1").tags["dgx.promotion"] == "champion"
    assert champion(edge_env) == "1"


def test_a_failed_trained_model_check_skips_champion_model_and_the_champion_stays(edge_env):
    assert run(edge_env).success and champion(edge_env) == "1"

    result = run(edge_env, trained_passes=False)  # registers version 2, whose blocking check fails
    assert not check_result(result, "beats_baseline").passed
    assert not materialized(result, "edge_model") and not materialized(result, "champion_model")  # blocked downstream
    assert champion(edge_env) == "1"

    # Materialized later in a run of their own, edge_model and champion_model still honour trained_model's failed
    # check: the promotion fails closed, says why, and the champion stays.
    result = run(edge_env, selection=["edge_model", "champion_model"])
    assert check_result(result, "parity").passed and materialized(result, "edge_model")
    assert not materialized(result, "champion_model") and not result.success
    failure = next(e for e in result.all_events if e.is_step_failure and e.step_key == "champion_model")
    assert "beats_baseline failed" in failure.step_failure_data.user_failure_data.description
    assert champion(edge_env) == "1"


def test_mismatched_preprocessing_fails_the_blocking_parity_check_and_skips_champion_model(edge_env):
    from mlflow import MlflowClient

    result = run(edge_env, edge_config={"input_scale": 1 / 255})
    assert not result.success  # a failed blocking check fails the run
    parity = check_result(result, "parity")
    assert not parity.passed and parity.severity == dg.AssetCheckSeverity.ERROR
    assert parity.metadata["top1_agreement"].value < 0.99
    # What to change is said in the result, as settings edge_model's config has.
    assert "`quantization: float16`" in parity.description and "`float_layers`" in parity.description
    assert "promoted" not in parity.metadata  # the check only judges
    assert not materialized(result, "champion_model") and champion(edge_env) is None

    # champion_model alone afterwards: the failed parity check holds it back, and the decision is tagged in MLflow.
    result = run(edge_env, selection=["champion_model"])
    assert not materialized(result, "champion_model") and champion(edge_env) is None
    version = MlflowClient(tracking_uri=edge_env["tracking_uri"]).get_model_version(MODEL_NAME, "1")
    assert version.tags["dgx.promotion"] == "blocked" and version.tags["dgx.gate.edge_model"] == "failed: parity failed"
