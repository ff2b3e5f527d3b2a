"""A real Spark Standalone cluster on 127.0.0.1, configured by deploy/spark, driven by the project's
SparkResource in its `standalone` profile through Dagster.

The master and the worker come from the pyspark package (`spark-class`) with SPARK_CONF_DIR=deploy/spark,
so the worker takes its GPUs from spark-env.sh and gpu-discovery.sh exactly as on a DGX node; only the
GPUs are fake (DGX_GPU_DISCOVERY_OVERRIDE), of which the operator allows two (DGX_ALLOWED_GPUS=4,5).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import dagster as dg
import pyspark
import pytest
from support.deploy_files import DEPLOY

from dgx_assets.defs.resources import SparkResource

PRESENT_GPUS = "0,1,2,3,4,5,6,7"
ALLOWED_GPUS = ["4", "5"]
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
# Sized for a 2-core test machine: two executors of one core and one GPU each, one GPU per task.
APPLICATION_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.task.resource.gpu.amount": "1",
    "spark.cores.max": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
    "spark.pyspark.python": sys.executable,
}


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str, logs: list[Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs if log.exists())
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def master_state(webui_port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


@pytest.fixture
def standalone_cluster(tmp_path):
    """Master and one worker (2 cores, the allowed fake GPUs); stopped by PID afterwards."""
    # A session left by an earlier test in this process (dagster_pyspark's resources never stop theirs) would be
    # returned by getOrCreate instead of one on this cluster: stop it and its JVM first.
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        stop_session_and_gateway()
    master_port, master_ui, worker_port, worker_ui = (free_port() for _ in range(4))
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
        "SPARK_CONF_DIR": str(DEPLOY / "spark"),  # spark-class sources spark-env.sh from here
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_LOCAL_DIRS": str(tmp_path / "local"),
        "SPARK_WORKER_CORES": "2",
        "SPARK_WORKER_MEMORY": "2g",
        "SPARK_DAEMON_MEMORY": "512m",
        "DGX_GPU_DISCOVERY_OVERRIDE": PRESENT_GPUS,
        "DGX_ALLOWED_GPUS": ",".join(ALLOWED_GPUS),
        "PYSPARK_PYTHON": sys.executable,
    }
    processes: list[subprocess.Popen] = []
    logs = [tmp_path / "master.log", tmp_path / "worker.log"]

    def start(log: Path, *args: str) -> None:
        with log.open("w") as out:
            # spark-class execs the JVM, so this PID is the daemon's own.
            processes.append(
                subprocess.Popen([str(SPARK_CLASS), *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
            )

    try:
        start(
            logs[0],
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(master_port),
            "--webui-port",
            str(master_ui),
        )
        wait_for(lambda: master_state(master_ui), 90, "the master", logs)
        master_url = f"spark://127.0.0.1:{master_port}"
        start(
            logs[1],
            "org.apache.spark.deploy.worker.Worker",
            master_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(worker_port),
            "--webui-port",
            str(worker_ui),
        )
        state = wait_for(
            lambda: (s := master_state(master_ui)) and s["aliveworkers"] == 1 and s, 90, "the worker to register", logs
        )
        yield master_url, state, logs
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def gpu_binding_probe():
    """Executor side: what Spark assigned each task, and what the binding in gpu.py made of it.

    Built in a function so that cloudpickle ships its code by value: executors cannot import tests.
    """

    def probe(batches):
        import pandas as pd

        from dgx_assets.spark.gpu import bind_task_gpus, task_gpu_addresses

        started = time.time()
        own = task_gpu_addresses()
        binding = bind_task_gpus()  # sets CUDA_VISIBLE_DEVICES before anything could import TensorFlow
        time.sleep(1.0)  # keep both executors busy at once
        for _ in batches:
            yield pd.DataFrame(
                {
                    # An executor's working directory is <SPARK_WORKER_DIR>/<app id>/<executor id>.
                    "executor": [os.path.basename(os.getcwd())],
                    "pid": [os.getpid()],
                    "own": [",".join(own)],
                    "visible": [os.environ.get("CUDA_VISIBLE_DEVICES")],
                    "label": [binding.device_label],
                    "started": [started],
                    "ended": [time.time()],
                }
            )

    return probe


@pytest.mark.timeout(300)
def test_standalone_tasks_each_get_and_bind_their_own_gpu(standalone_cluster, tmp_path, monkeypatch):
    master_url, state, logs = standalone_cluster
    [worker] = state["workers"]
    # spark-env.sh offered two GPUs and gpu-discovery.sh reported exactly the allowed ones.
    assert worker["state"] == "ALIVE"
    assert sorted(worker["resources"]["gpu"]["addresses"]) == ALLOWED_GPUS

    monkeypatch.setenv("DGX_DEPLOYMENT", "standalone")
    spark = SparkResource(
        master=master_url,
        spark_conf=APPLICATION_CONF,
    )
    assert spark.spark_config["spark.executor.resource.gpu.amount"] == "1"  # from the profile itself

    @dg.asset
    def gpu_probe(spark: SparkResource) -> list[dict]:
        session = spark.spark_session
        schema = "executor string, pid long, own string, visible string, label string, started double, ended double"
        rows = session.range(0, 8, 1, 8).mapInPandas(gpu_binding_probe(), schema).collect()
        return [row.asDict() for row in rows]

    try:
        result = dg.materialize([gpu_probe], resources={"spark": spark})
        rows = result.output_for_node("gpu_probe")
    finally:
        stop_session_and_gateway()  # the resource's session; the cluster goes next

    assert len(rows) == 8
    for row in rows:
        assert row["own"] in ALLOWED_GPUS, row  # exactly one allowed GPU per task
        assert row["visible"] == row["own"], row  # gpu.py applied it before TensorFlow could start
        assert row["label"] == f"gpu:{row['own']}"
    gpu_of_executor = {}
    for row in rows:
        gpu_of_executor.setdefault(row["executor"], set()).add(row["own"])
    # Two executors, each holding one GPU for its whole life, different from the other's.
    assert len(gpu_of_executor) == 2, gpu_of_executor
    assert all(len(gpus) == 1 for gpus in gpu_of_executor.values())
    assert set().union(*gpu_of_executor.values()) == set(ALLOWED_GPUS)
    # Tasks that ran at the same time never shared a GPU.
    overlapping = [
        (a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if a["started"] < b["ended"] and b["started"] < a["ended"]
    ]
    assert overlapping, "the two executors never ran tasks concurrently"
    assert all(a["own"] != b["own"] for a, b in overlapping)


def stop_session_and_gateway() -> None:
    """Stop the session and the JVM that served it, so later tests start a fresh local one.

    The JVM keeps the settings it was launched with as system properties; a later local session in this
    process would inherit this cluster's master and task GPU amounts, and a local job asking for task GPUs
    hangs (a pitfall in docs/architecture.md).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    SparkSession.builder.getOrCreate().stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM's gateway server exits when its stdin closes
        gateway.proc.wait(timeout=60)
        SparkContext._gateway = None
        SparkContext._jvm = None


def tiny_feature_files(folder: Path):
    """Two image_features-shaped Parquet files (8x8 grey tensors, bright = defective): enough to train a step."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from dgx_assets.training.dataset import FeatureFiles

    rng, paths = np.random.default_rng(0), []
    for batch in ("b0", "b1"):
        labels = ["defective", "functional"] * 20
        splits = (["train"] * 6 + ["validation", "test"] * 2) * 4
        tensors = [
            rng.integers(150 if label == "defective" else 0, 256 if label == "defective" else 100, 64, dtype=np.uint8).tobytes()
            for label in labels
        ]
        table = pa.table(
            {
                "label": labels,
                "split": splits,
                "feature_status": ["ok"] * 40,
                "tensor_shape": [[8, 8, 1]] * 40,
                "tensor": pa.array(tensors, pa.binary()),
            }
        )
        paths.append(str(folder / f"{batch}.parquet"))
        pq.write_table(table, paths[-1])
    return FeatureFiles(pafs.LocalFileSystem(), tuple(paths))


@pytest.mark.timeout(300)
def test_standalone_training_workers_each_bind_their_own_gpu(standalone_cluster, tmp_path, monkeypatch):
    from dgx_assets.training.config import TrainConfig
    from dgx_assets.training.distributed import train_on_spark

    master_url, _, _ = standalone_cluster
    monkeypatch.setenv("DGX_DEPLOYMENT", "standalone")
    spark = SparkResource(
        master=master_url,
        spark_conf=APPLICATION_CONF,
    )
    config = TrainConfig(backbone="scratch", width=4, epochs=1, batch_size=8, augment=False)
    try:
        with dg.build_init_resource_context() as init:
            spark.setup_for_execution(init)
        result = train_on_spark(spark.spark_session, tiny_feature_files(tmp_path), config, str(tmp_path / "ckpt"))
    finally:
        stop_session_and_gateway()

    assert len(result.workers) == 2 and all(w.steps > 0 for w in result.workers)
    for worker in result.workers:
        [gpu] = worker.spark_gpus  # one whole GPU per training task (the stage's resource profile)
        assert gpu in ALLOWED_GPUS
        assert worker.cuda_visible_devices == gpu  # bound before TensorFlow started in the worker process
    assert sorted(w.spark_gpus[0] for w in result.workers) == ALLOWED_GPUS  # each its own
