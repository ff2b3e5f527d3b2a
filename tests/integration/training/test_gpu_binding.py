"""GPU binding of executor Python workers, tested without a GPU: Spark hands tasks fake addresses from a
discovery script, and each task must see and apply exactly its own address."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dgx_assets.spark.gpu import NO_GPU, GpuBindingError, WorkerGpuBinder

FAKE_ADDRESSES = ["4", "5"]


class _TensorflowFlag:
    """Stands in for "TensorFlow is in sys.modules" so one process can play several workers."""

    def __init__(self) -> None:
        self.loaded = False

    def __call__(self) -> bool:
        return self.loaded


def test_binding_sets_devices_and_threads_before_tensorflow():
    environ: dict[str, str] = {}
    binder = WorkerGpuBinder(environ=environ, tensorflow_loaded=_TensorflowFlag())

    binding = binder.bind(["4"], cpu_threads=3)

    assert binding.addresses == ("4",) and binding.device_label == "gpu:4"
    assert environ["CUDA_VISIBLE_DEVICES"] == "4"
    assert environ["TF_NUM_INTRAOP_THREADS"] == "3" and environ["OMP_NUM_THREADS"] == "3"


def test_no_gpu_assigned_hides_all_gpus_and_matches_cpu_threads():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    binding = WorkerGpuBinder(environ=environ, tensorflow_loaded=_TensorflowFlag()).bind([], cpu_threads=4)

    assert binding.device_label == "cpu" and not binding.uses_gpu
    assert environ["CUDA_VISIBLE_DEVICES"] == NO_GPU
    assert environ["TF_NUM_INTRAOP_THREADS"] == "4"


def test_reused_worker_rebinds_before_tensorflow_and_refuses_after():
    environ: dict[str, str] = {}
    tensorflow = _TensorflowFlag()
    binder = WorkerGpuBinder(environ=environ, tensorflow_loaded=tensorflow)

    binder.bind(["4"], 1)
    binder.bind(["5"], 1)  # CUDA not initialised yet: the new address still takes effect
    assert environ["CUDA_VISIBLE_DEVICES"] == "5"

    tensorflow.loaded = True
    assert binder.bind(["5"], 1).addresses == ("5",)  # same address: fine
    with pytest.raises(GpuBindingError, match=r"\['4'\].*gpu:5.*spark.executor.resource.gpu.amount=1"):
        binder.bind(["4"], 1)
    assert environ["CUDA_VISIBLE_DEVICES"] == "5"  # untouched: the worker still tells the truth


def test_a_cpu_task_adopts_a_worker_where_another_udf_imported_tensorflow_without_gpus():
    environ: dict[str, str] = {}  # the other UDF never set CUDA_VISIBLE_DEVICES
    tensorflow = _TensorflowFlag()
    tensorflow.loaded = True
    cpu_only = WorkerGpuBinder(environ=environ, tensorflow_loaded=tensorflow, tensorflow_gpus=lambda: 0)
    assert cpu_only.bind([], 2).device_label == "cpu"

    with_gpus = WorkerGpuBinder(environ={}, tensorflow_loaded=tensorflow, tensorflow_gpus=lambda: 8)
    with pytest.raises(GpuBindingError, match="none"):  # a CPU task on a worker whose TensorFlow holds GPUs
        with_gpus.bind([], 2)
    with pytest.raises(GpuBindingError):  # and a GPU task can never adopt a TensorFlow bound elsewhere
        WorkerGpuBinder(environ={}, tensorflow_loaded=tensorflow, tensorflow_gpus=lambda: 0).bind(["4"], 2)


def test_real_tensorflow_import_freezes_the_binding(tmp_path):
    """In a fresh interpreter: bind, import TensorFlow for real, then a task with another GPU is refused."""
    script = textwrap.dedent(
        """
        import json, os
        from dgx_assets.spark.gpu import GpuBindingError, WorkerGpuBinder, describe_device
        binder = WorkerGpuBinder()
        binder.bind(["4"], 1)
        binder.bind(["5"], 1)
        tf = binder.tensorflow()
        result = {"visible": os.environ["CUDA_VISIBLE_DEVICES"],
                  "device": describe_device(binder.binding, tf)}
        try:
            binder.bind(["4"], 1)
            result["error"] = None
        except GpuBindingError as exc:
            result["error"] = str(exc)
        print("RESULT" + json.dumps(result))
        """
    )
    result = _run_python(script, timeout=180)
    assert result["visible"] == "5"
    # No GPU on this machine: the rows say so instead of pretending.
    assert result["device"] == "cpu (gpu:5 assigned, not visible to TensorFlow)"
    assert result["error"] and "already initialised TensorFlow on gpu:5" in result["error"]


def test_spark_tasks_apply_exactly_their_own_gpu_address(tmp_path):
    """local-cluster: one executor with two (fake) GPUs and two cores, one GPU per task."""
    discovery = tmp_path / "discover-gpus.sh"
    discovery.write_text("#!/bin/sh\necho '" + json.dumps({"name": "gpu", "addresses": FAKE_ADDRESSES}) + "'\n")
    discovery.chmod(0o755)
    script = textwrap.dedent(
        f"""
        import json, os
        import pandas as pd
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local-cluster[1,2,1024]")
                 .config("spark.ui.enabled", "false")
                 .config("spark.worker.resource.gpu.amount", "2")
                 .config("spark.worker.resource.gpu.discoveryScript", {str(discovery)!r})
                 .config("spark.executor.resource.gpu.amount", "2")
                 .config("spark.executor.resource.gpu.discoveryScript", {str(discovery)!r})
                 .config("spark.task.resource.gpu.amount", "1")
                 .getOrCreate())

        def probe(batches):
            import time
            from dgx_assets.spark.gpu import GpuBindingError, bind_task_gpus, describe_device, task_gpu_addresses
            own = ",".join(task_gpu_addresses())
            before = os.environ.get("CUDA_VISIBLE_DEVICES")
            try:
                binding = bind_task_gpus()
                tf = binding.tensorflow()
                device, error = describe_device(binding, tf), None
            except GpuBindingError as exc:
                device, error = None, str(exc)
            time.sleep(1)  # keep both task slots busy so both addresses are in use at once
            for rows in batches:
                yield pd.DataFrame({{"pid": [os.getpid()], "own": [own], "before": [before],
                                    "visible": [os.environ.get("CUDA_VISIBLE_DEVICES")],
                                    "threads": [os.environ.get("TF_NUM_INTRAOP_THREADS")],
                                    "device": [device], "error": [error]}})

        rows = (spark.range(0, 6, 1, 6)
                .mapInPandas(probe, "pid long, own string, before string, visible string, threads string, "
                                    "device string, error string")
                .collect())
        spark.stop()
        print("RESULT" + json.dumps([r.asDict() for r in rows]))
        """
    )
    rows = _run_python(script, timeout=420)

    assert len(rows) == 6
    assert {row["own"] for row in rows} == set(FAKE_ADDRESSES)  # both GPUs were handed out
    for row in rows:
        assert row["own"] in FAKE_ADDRESSES and "," not in row["own"]  # one GPU per task
        assert row["threads"] == "1"  # spark.task.cpus
        if row["error"] is None:
            # The task computed where Spark told it to, and nowhere else.
            assert row["visible"] == row["own"]
            assert row["device"] == f"cpu (gpu:{row['own']} assigned, not visible to TensorFlow)"
        else:
            # A reused worker handed another GPU after TensorFlow started: refused, never computed.
            assert row["before"] != row["own"] and row["before"] in FAKE_ADDRESSES
            assert f"Spark assigned GPU address(es) ['{row['own']}']" in row["error"]


def _run_python(script: str, timeout: int):
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parents[3]
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT")]
    assert completed.returncode == 0 and lines, completed.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT") :])
