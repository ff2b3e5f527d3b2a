"""hyperparameter_search: a tiny real search on Ray on a local-cluster Spark, nested MLflow runs, the best
recipe taken by trained_model's config. Skipped only where Ray is not installed (CI installs it: the test extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the `ray` extra is not installed")

from dgx_assets.lake.store import Lake
from dgx_assets.training.config import TrainConfig
from dgx_assets.tuning.best_config import SEARCHED_FIELDS, apply_best_config

HERE = Path(__file__).parent


def loopback_only(command: list[str]) -> list[str]:
    """The command in a network namespace of its own that holds only loopback.

    Ray's GCS server and raylet listen on every interface, with no setting to bind them to 127.0.0.1; inside
    a fresh namespace every interface is loopback, so nothing the test starts is reachable from elsewhere.
    """
    import shutil

    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        pytest.skip(
            "Ray listens on every interface: this test runs it in a private network namespace "
            "(unshare -n, as root), which this machine cannot make"
        )
    script = 'ip link set lo up && exec "$@"'
    return ["unshare", "--net", "sh", "-c", script, "sh", *command]


def test_a_tiny_search_on_ray_on_spark_is_tracked_and_feeds_trained_model(tmp_path):
    from mlflow import MlflowClient

    lake, tracking_uri = tmp_path / "lake", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    command = [sys.executable, str(HERE / "search_run.py"), str(lake), tracking_uri]
    done = subprocess.run(loopback_only(command), check=False, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(lines[-1][len("RESULT ") :])

    assert report["master"] == "local-cluster[2,1,1024]"
    # The Ray cluster lived on the executors while in use, and was gone after a failure inside it.
    assert report["nodes_during"] >= 2 and report["jobs_during"] >= 1
    assert report["raised"] == "a trial blew up"
    assert report["ray_connected_after"] is False and report["jobs_after"] == 0
    assert report["success"] and report["ray_connected_end"] is False and report["jobs_end"] == 0
    assert report["trials"] == 4 and report["stopped_early"] >= 1  # ASHA stopped the worst trials

    client = MlflowClient(tracking_uri)
    parent = client.get_run(report["mlflow_run_id"])
    assert parent.data.tags["dagster.run_id"] == report["dagster_run_id"]
    assert parent.data.tags["dagster.partition_keys"] == ",".join(report["keys"])
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 4
    assert all(set(SEARCHED_FIELDS) <= set(child.data.params) for child in children)
    assert sum(child.data.tags["dgx.stopped_early"] == "True" for child in children) == report["stopped_early"]
    histories = [client.get_metric_history(child.info.run_id, "val_loss") for child in children]
    assert max(len(h) for h in histories) == 6 and min(len(h) for h in histories) < 6

    # trained_model's recipe takes exactly the searched fields from the file the search wrote.
    store = Lake(str(lake))
    searched, record = apply_best_config(store, TrainConfig())
    assert record["mlflow_run_id"] == parent.info.run_id
    assert {k: getattr(searched, k) for k in SEARCHED_FIELDS} == record["hyperparameters"]
    assert searched.model_copy(update={k: getattr(TrainConfig(), k) for k in SEARCHED_FIELDS}) == TrainConfig()
    assert record["hyperparameters"]["learning_rate"] == float(parent.data.params["best_learning_rate"])


def test_asking_for_searched_hyperparameters_without_a_search_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="materialize hyperparameter_search first"):
        apply_best_config(Lake(str(tmp_path / "lake")), TrainConfig())
