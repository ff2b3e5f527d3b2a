"""edge_model, its parity check and champion_model's decision in a real Dagster instance, with the lake and
MLflow resources, and the quality report of the same run.

trained_model (issue 3) is stood in for by a small asset that writes exactly what its contract says —
`<lake>/trained_model/model.keras`, `model_info.json`, an MLflow run and a registered version — plus its gate,
the real check spec judged in its step, with a verdict the test chooses. raw_images and image_features
rows are written per the table layout of docs/architecture.md.
"""

import hashlib
import json

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest
from support.edge_data import CLASS_NAMES, RAW_SIZE, features_like_image_features
from support.lake_tables import commit_rows

from dgx_assets.defs.edge.assets import edge_model
from dgx_assets.defs.edge.champion import champion_model
from dgx_assets.defs.model.checks import MODEL_GATE_CHECK
from dgx_assets.defs.reporting.assets import quality_report, report_verdict
from dgx_assets.defs.resources import LakeResource, MlflowResource

MODEL_NAME = "dgx_defect_classifier"


class StandInCheckConfig(dg.Config):
    passes: bool = True


def stand_in_trained_model(model_path):
    @dg.asset(name="trained_model", check_specs=[MODEL_GATE_CHECK])
    def trained_model(config: StandInCheckConfig, lake: LakeResource, mlflow: MlflowResource) -> dg.MaterializeResult:
        from mlflow import MlflowClient

        from dgx_assets.tracking.store import ensure_experiment

        client = MlflowClient(tracking_uri=mlflow.tracking_config().tracking_uri)
        # As trained_model makes it: artifacts beside the sqlite store, not in ./mlruns of the test's directory.
        run = client.create_run(ensure_experiment(client, mlflow.experiment_name, mlflow.tracking_config().tracking_uri))
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
            "feature_files": list(store.tables.snapshot("image_features").uris),
            "feature_snapshot_id": str(store.tables.snapshot("image_features").snapshot_id),
        }
        store.write_bytes(f"{base}/model_info.json", json.dumps(info).encode())
        verdict = dg.AssetCheckResult(
            check_name=MODEL_GATE_CHECK.name,
            passed=config.passes,
            description=None if config.passes else "accuracy 0.5 is no better",
        )
        return dg.MaterializeResult(check_results=[verdict])

    return trained_model


def write_tables(lake_root, dataset) -> None:
    """One batch of raw_images and image_features rows for the fixture images."""
    import hashlib
    import io

    from PIL import Image

    sha = [hashlib.sha256(content).hexdigest() for content in dataset.contents]
    sizes = [Image.open(io.BytesIO(content)).size for content in dataset.contents]
    raw = pa.table(
        {
            "path": [f"file:///landing/b1/{label}/{index}.png" for index, label in enumerate(dataset.labels)],
            "sha256": sha,
            "batch": ["b1"] * len(sha),
            "label": dataset.labels,
            "split": dataset.splits,
            "size_bytes": [len(content) for content in dataset.contents],
            "format": ["PNG"] * len(sha),
            "mode": ["L"] * len(sha),
            "status": ["valid"] * len(sha),
            "reason": [""] * len(sha),
            "width": [w for w, _ in sizes],
            "height": [h for _, h in sizes],
            "content": dataset.contents,
        }
    )
    tensors = features_like_image_features(dataset.contents)
    grey = tensors.reshape(len(tensors), -1) / 255.0
    features = pa.table(
        {
            "sha256": sha,
            "batch": ["b1"] * len(sha),
            "label": dataset.labels,
            "split": dataset.splits,
            "feature_status": ["ok"] * len(sha),
            "tensor": [t.tobytes() for t in tensors],
            "tensor_shape": [list(t.shape) for t in tensors],
            "brightness": grey.mean(axis=1),
            "contrast": grey.std(axis=1),
            "sharpness": grey.var(axis=1),
        }
    )
    for name, table in (("raw_images", raw), ("image_features", features)):
        commit_rows(lake_root, name, table, "b1")


@pytest.fixture
def edge_env(tmp_path, edge_dataset, trained_classifier):
    write_tables(tmp_path / "lake", edge_dataset)
    resources = {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
    }
    trained_model = stand_in_trained_model(trained_classifier.path)
    with dg.instance_for_test() as instance:
        yield {
            "assets": [trained_model, edge_model, champion_model],
            "resources": resources,
            "instance": instance,
            "lake": tmp_path / "lake",
            "tracking_uri": resources["mlflow"].tracking_uri,
        }


def run(env, selection=None, trained_passes=True, edge_config=None, report=False):
    run_config = {"ops": {}}
    if selection is None:
        run_config["ops"]["trained_model"] = {"config": {"passes": trained_passes}}
    if edge_config:
        run_config["ops"]["edge_model"] = {"config": edge_config}
    # Through a Definitions' asset job, as the webserver and daemon launch it (a repository is set).
    everything = env["assets"] + ([quality_report, report_verdict] if report else [])
    assets = [a for a in everything if not isinstance(a, dg.AssetChecksDefinition)]
    checks = [a for a in everything if isinstance(a, dg.AssetChecksDefinition)]
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
    assert metadata["format"].value == "int8" and "int8, the first format of the ladder" in metadata["format_reason"].value
    assert "| int8 |" in metadata["formats_tried"].value and "float16" not in metadata["formats_tried"].value
    assert metadata["size_ratio"].value < 1 and metadata["tflite_latency_ms"].value > 0
    assert f"[1, {RAW_SIZE}, {RAW_SIZE}, 1]" in metadata["raw_input"].value
    assert metadata["feature_source"].value.startswith("the image_features snapshot trained_model used (")

    edge_dir = edge_env["lake"] / "edge_model"
    assert {p.name for p in edge_dir.iterdir()} == {"model.tflite", "edge_model.json", "parity.json", "parity.png", "triton"}
    contract = json.loads((edge_dir / "edge_model.json").read_text())
    assert (contract["raw_height"], contract["raw_width"], contract["input_dtype"]) == (RAW_SIZE, RAW_SIZE, "uint8")
    from dgx_assets.station.tflite_metadata import read_contract

    assert read_contract((edge_dir / "model.tflite").read_bytes()) == contract  # the model carries its own contract
    assert contract["format"] == "int8"
    triton_config = (edge_dir / "triton" / "defect_classifier" / "config.pbtxt").read_text()
    assert 'key: "edge_format" value: { string_value: "int8" }' in triton_config
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
    assert mlflow_run.data.tags["dgx.edge_model.format"] == "int8" and "edge_int8_accuracy" in mlflow_run.data.metrics
    # The digest edge-fetch verifies, on the run and on the version built from it.
    digest = hashlib.sha256((edge_dir / "model.tflite").read_bytes()).hexdigest()
    assert mlflow_run.data.tags["dgx.edge_model.sha256"] == digest
    assert client.get_model_version(MODEL_NAME, "1").tags["dgx.edge_model.sha256"] == digest

    # The promotion is champion_model's materialization, not a side effect of the check.
    promotion = result.asset_materializations_for_node("champion_model")[0].metadata
    assert promotion["decision"].value == "promoted" and promotion["model_version"].value == f"{MODEL_NAME} v1"
    assert promotion["outcome"].value == f"{MODEL_NAME} v1 is the champion (before: none)"
    assert "trained_model.beats_baseline_and_champion: passed" in promotion["gates"].value
    assert "edge_model.parity: passed" in promotion["gates"].value and "reason" not in promotion
    assert mlflow_run.data.tags["dgx.promotion"] == "champion (version 1)"
    assert client.get_model_version(MODEL_NAME, "1").tags["dgx.promotion"] == "champion"
    assert champion(edge_env) == "1"


def test_a_failed_trained_model_gate_holds_the_version_back_in_the_same_run(edge_env):
    assert run(edge_env).success and champion(edge_env) == "1"

    # Registers version 2, whose gate fails: not a failed run, a decision champion_model records, and the same
    # run's quality report explains.
    result = run(edge_env, trained_passes=False, report=True)
    assert result.success and not check_result(result, "beats_baseline_and_champion").passed
    assert materialized(result, "edge_model") and materialized(result, "quality_report")
    decision = result.asset_materializations_for_node("champion_model")[0].metadata
    assert decision["decision"].value == "held back"
    assert decision["outcome"].value == f"{MODEL_NAME} v2 not promoted, stays candidate; the champion stays v1"
    assert "**trained_model.beats_baseline_and_champion** failed: accuracy 0.5 is no better" in decision["reason"].value
    assert champion(edge_env) == "1"


def test_a_failing_parity_gate_holds_the_version_back_and_the_same_run_reports_why(edge_env):
    from mlflow import MlflowClient

    # Materialize all with an edge path that does not match training: every format fails the parity gate.
    result = run(edge_env, edge_config={"input_scale": 1 / 255}, report=True)
    assert result.success  # held back is a decision, not a failed run
    parity = check_result(result, "parity")
    assert not parity.passed and parity.severity == dg.AssetCheckSeverity.ERROR and not parity.blocking
    assert parity.metadata["top1_agreement"].value < 0.99
    # Every format of the ladder failed: the edge path itself is wrong, and the result says where to look.
    formats = result.asset_materializations_for_node("edge_model")[0].metadata["formats_tried"].value
    assert all(f"| {name} |" in formats for name in ("int8", "float16", "float32")) and "| pass |" not in formats
    assert parity.metadata["format"].value == "float32"
    assert "no format passed" not in parity.description  # what was found; what to fix is its own entry
    assert "No format passed" in parity.metadata["to_fix"].value and "input_scale" in parity.metadata["to_fix"].value
    for criterion in json.loads((edge_env["lake"] / "edge_model" / "parity.json").read_text())["gate"]["criteria"]:
        # each criterion's figure beside its limit, as numbers the UI plots
        assert parity.metadata[f"max_{criterion['name']}"].value == criterion["threshold"]
        assert parity.metadata[criterion["name"]].value == pytest.approx(criterion["value"], rel=1e-3, abs=1e-9)

    # champion_model's page: held back, why (the check's own what-to-fix), each criterion against its threshold.
    decision = result.asset_materializations_for_node("champion_model")[0].metadata
    assert decision["decision"].value == "held back"
    assert decision["outcome"].value == f"{MODEL_NAME} v1 not promoted, stays candidate; the champion stays none"
    assert f"**edge_model.parity** failed: {parity.description}" in decision["reason"].value
    assert parity.metadata["to_fix"].value in decision["to_fix"].value
    assert "materialize champion_model again" in decision["to_fix"].value
    record = json.loads((edge_env["lake"] / "edge_model" / "parity.json").read_text())
    for criterion in record["gate"]["criteria"]:
        assert f"| edge_model.parity | {criterion['name']} |" in decision["gate_criteria"].value
    assert champion(edge_env) is None

    # The model version in MLflow carries the decision, each criterion's figure and threshold, and the reason.
    client = MlflowClient(tracking_uri=edge_env["tracking_uri"])
    tags = client.get_model_version(MODEL_NAME, "1").tags
    assert tags["dgx.promotion"] == "held back" and tags["dgx.gate.edge_model.parity"] == f"failed: {parity.description}"
    assert tags["dgx.promotion.reasons"] == f"edge_model.parity: {parity.description}"
    for criterion in record["gate"]["criteria"]:
        result_word = "passed" if criterion["passed"] else "failed"
        expected = f"{criterion['value']:.4g} (at most {criterion['threshold']:.4g}): {result_word}"
        assert tags[f"dgx.gate.edge_model.parity.{criterion['name']}"] == expected
    assert str(client.get_model_version_by_alias(MODEL_NAME, "candidate").version) == "1"  # it stays candidate
    assert client.get_run(record["trained_model"]["mlflow_run_id"]).data.tags["dgx.promotion"] == "held back"

    # The quality report was made in the same run, and its verdict leads with the decision and the fix.
    report = result.asset_materializations_for_node("quality_report")[0].metadata
    assert report["verdict"].value == "fail"
    page = (edge_env["lake"] / "quality_report" / "report.html").read_text()
    assert f"{MODEL_NAME} v1 not promoted, stays candidate" in page and "input_scale" in page

    # champion_model alone afterwards decides the same, from the instance's record of the parity check.
    result = run(edge_env, selection=["champion_model"])
    assert result.success and champion(edge_env) is None
    assert result.asset_materializations_for_node("champion_model")[0].metadata["decision"].value == "held back"
