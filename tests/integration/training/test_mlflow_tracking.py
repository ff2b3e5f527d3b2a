"""One MLflow run per training: params, per-epoch and test metrics, plots, datasets with digests, Dagster
tags, hardware baseline, the registered version aliased `candidate`, and a model that reloads identically."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dgx_assets.lake.store import Lake
from dgx_assets.tracking.hardware import hardware_baseline
from dgx_assets.tracking.lineage import DagsterLineage, dataset_digest, describe_files
from dgx_assets.tracking.registry import CANDIDATE_ALIAS
from dgx_assets.tracking.store import TrackingConfig, TrackingConfigError
from dgx_assets.training.config import TrainConfig
from dgx_assets.training.dataset import make_dataset, scan_features
from dgx_assets.training.outputs import INFO_FILE, MODEL_FILE, MODEL_INFO_KEYS, model_info, write_model_outputs
from dgx_assets.training.tracking import train_and_track

MODEL_NAME = "test_defect_classifier"


@pytest.fixture(scope="module")
def tracked(feature_files, tmp_path_factory):
    from dgx_assets.training.config import TrainConfig

    store = tmp_path_factory.mktemp("mlflow")
    tracking = TrackingConfig(
        tracking_uri=f"sqlite:///{store}/mlflow.db", experiment_name="dgx_assets_test", registered_model_name=MODEL_NAME
    )
    lineage = DagsterLineage(run_id="0123456789abcdef", partition_keys=("b0", "b1"), code_version="7")
    config = TrainConfig(backbone="scratch", width=8, epochs=4, batch_size=16, patience=4)
    result = train_and_track(feature_files, "file:///lake/image_features", config, tracking, str(store / "ckpt"), lineage)
    return result, tracking


def test_run_records_params_metrics_plots_and_lineage(tracked, feature_files):
    from mlflow import MlflowClient

    result, tracking = tracked
    client = MlflowClient(tracking.tracking_uri)
    run = client.get_run(result.run_id)

    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "dgx_assets_test"
    params = run.data.params
    assert params["backbone"] == "scratch" and params["input_shape"] == "32x32x1"
    assert (params["epochs"], params["batch_size"], params["learning_rate"], params["seed"]) == ("4", "16", "0.002", "42")
    assert params["strategy"] == "MirroredStrategy" and params["replicas"] == "1"

    val_loss = client.get_metric_history(result.run_id, "val_loss")
    assert [m.step for m in val_loss] == [0, 1, 2, 3]
    metrics = run.data.metrics
    assert metrics["test_accuracy"] == pytest.approx(result.training.test.metrics["accuracy"])
    assert metrics["test_accuracy"] > metrics["test_majority_baseline_accuracy"]
    assert {"test_roc_auc", "test_f1_defective", "test_precision_functional", "test_recall_defective"} <= set(metrics)

    tags = run.data.tags
    assert tags["dagster.run_id"] == "0123456789abcdef" and tags["dagster.asset_key"] == "trained_model"
    assert tags["dagster.partition_keys"] == "b0,b1" and tags["dagster.code_version"] == "7"
    # A real commit of this repository (HEAD itself may move while others commit during the test).
    commit = tags["git.commit"]
    assert len(commit) == 40 and tags["mlflow.source.git.commit"] == commit
    assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=Path(__file__).parents[3]).returncode == 0
    assert tags["hardware.kind"] == "cpu" and int(tags["hardware.cpu_cores"]) >= 1

    artifacts = {a.path for a in client.list_artifacts(result.run_id)} | {
        a.path for folder in ("plots", "hardware", "datasets", "evaluation") for a in client.list_artifacts(result.run_id, folder)
    }
    assert {
        "plots/confusion_matrix.png",
        "plots/training_curves.png",
        "plots/roc_curve.png",
        "hardware/baseline.json",
        "datasets/feature_files.json",
        "evaluation/test_report.json",
    } <= artifacts
    baseline = json.loads(Path(client.download_artifacts(result.run_id, "hardware/baseline.json")).read_text())
    assert baseline["cpu_model"] and baseline["memory_bytes"] > 0


def test_datasets_are_logged_with_digests_of_the_exact_files(tracked, feature_files):
    from mlflow import MlflowClient

    result, tracking = tracked
    inputs = MlflowClient(tracking.tracking_uri).get_run(result.run_id).inputs.dataset_inputs
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs}

    entries = describe_files(feature_files)
    assert by_context["training"].digest == dataset_digest(entries, ["train", "validation"])[:32]
    assert by_context["test"].digest == dataset_digest(entries, ["test"])[:32]
    profile = json.loads(by_context["test"].profile)
    assert profile["num_rows"] == scan_features(feature_files).rows("test") and profile["files"] == 2
    assert json.loads(by_context["training"].source) == {"uri": "file:///lake/image_features"}


def test_digest_changes_with_the_bytes_of_any_file(tmp_path, feature_files):
    import shutil

    import pyarrow.fs as pafs

    from dgx_assets.training.dataset import FeatureFiles

    copies = []
    for index, path in enumerate(feature_files.paths):
        copies.append(tmp_path / f"part-{index}.parquet")
        shutil.copy(path, copies[-1])
    files = FeatureFiles(pafs.LocalFileSystem(), tuple(str(p) for p in copies))
    before = dataset_digest(describe_files(files), ["test"])
    with open(copies[1], "ab") as handle:
        handle.write(b"\0")
    assert dataset_digest(describe_files(files), ["test"]) != before
    assert dataset_digest(describe_files(files), ["train"]) != dataset_digest(describe_files(files), ["test"])


def test_candidate_version_reloads_and_predicts_the_same(tracked, feature_files, tmp_path):
    import keras
    import mlflow

    result, tracking = tracked
    client = mlflow.MlflowClient(tracking.tracking_uri)
    candidate = client.get_model_version_by_alias(MODEL_NAME, CANDIDATE_ALIAS)
    assert str(candidate.version) == result.model_version and candidate.run_id == result.run_id

    info = mlflow.models.get_model_info(f"models:/{MODEL_NAME}@{CANDIDATE_ALIAS}")
    spec = info.signature.inputs.inputs[0]
    assert spec.type == np.dtype("float32") and spec.shape == (-1, 32, 32, 1)
    assert info.saved_input_example_info is not None

    index = scan_features(feature_files)
    images = np.concatenate([x.numpy() for x, _ in make_dataset(feature_files, index, "test", batch_size=64)])
    before = np.asarray(result.training.model(images, training=False))
    mlflow.set_tracking_uri(tracking.tracking_uri)
    from_registry = mlflow.tensorflow.load_model(f"models:/{MODEL_NAME}@{CANDIDATE_ALIAS}")
    assert np.allclose(from_registry.predict(images, verbose=0), before, atol=1e-6)

    # The lake copy the edge model reads: same predictions, and the contract file beside it.
    lake = Lake(str(tmp_path / "lake"))
    info_doc = model_info(result, tracking.tracking_uri, lake, ["b0", "b1"])
    folder = write_model_outputs(lake, result, info_doc)
    local = tmp_path / "reloaded.keras"
    local.write_bytes(lake.read_bytes(f"{folder}/{MODEL_FILE}"))
    reloaded = keras.models.load_model(local)  # plain Keras: no project code needed
    assert np.allclose(reloaded.predict(images, verbose=0), before, atol=1e-6)
    assert reloaded.input_shape == (None, 32, 32, 1) and reloaded.output_shape == (None, 2)
    saved_info = json.loads(lake.read_bytes(f"{folder}/{INFO_FILE}"))
    assert set(MODEL_INFO_KEYS) <= set(saved_info)
    assert saved_info["class_names"] == ["defective", "functional"] and saved_info["input_shape"] == [32, 32, 1]
    assert saved_info["mlflow_run_id"] == result.run_id and saved_info["model_version"] == result.model_version
    assert saved_info["test_metrics"]["accuracy"] == pytest.approx(result.training.test.metrics["accuracy"])


def test_hardware_baseline_reads_nvidia_smi_on_gpu_machines(tmp_path, monkeypatch):
    # No GPU here: a stand-in nvidia-smi answers the two queries the baseline makes.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"; '
        'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)"; exit 0; fi\n'
        'if [ "$1 $2 $3" = "-q -d POWER,CLOCK,TEMPERATURE" ]; then echo "    Power Draw : 71.3 W"; exit 0; fi\n'
        "exit 2\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")

    baseline = hardware_baseline()

    assert baseline["kind"] == "gpu" and len(baseline["gpus"]) == 2 and "H100" in baseline["gpus"][0]
    assert "Power Draw : 71.3 W" in baseline["nvidia_smi_query"]
    assert baseline["cpu_cores"] >= 1  # the CPU is recorded as well


def test_cpu_baseline_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    baseline = hardware_baseline()
    assert baseline["kind"] == "cpu" and baseline["gpus"] == []
    assert baseline["cpu_model"] and baseline["cpu_cores"] >= 1 and baseline["memory_bytes"] > 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "uri",
    [f"http://127.0.0.1:{_free_port()}", "sqlite:////proc/no-such-dir/mlflow.db", "ftp://example/mlflow"],
    ids=["nothing-listening", "unwritable-sqlite", "unknown-scheme"],  # stable ids: the port differs per process
)
def test_unusable_tracking_uri_fails_before_training_and_names_the_setting(feature_files, tmp_path, uri):
    tracking = TrackingConfig(tracking_uri=uri, experiment_name="x", registered_model_name=MODEL_NAME)
    with pytest.raises(TrackingConfigError, match="MLFLOW_TRACKING_URI"):
        train_and_track(feature_files, "file:///lake", TrainConfig(), tracking, str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()  # nothing trained, nothing checkpointed
