"""One barrier task of distributed training (``distributed``), in a Spark Python worker: it binds the task's GPU,
all-gathers ``host:port`` from every task into ``TF_CONFIG`` and starts the TensorFlow worker
(``distributed_worker``) as a child process that dies with it; a fresh process per attempt, so a retried stage
never meets TensorFlow state of a dead one. It must not import TensorFlow itself."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

from dgx_assets.training.distributed_job import DistributedTrainingError

_LOG_TAIL = 4000


def barrier_task(job_bytes: bytes):
    """The function each barrier task runs: its TensorFlow worker as a child process, then its pickled result."""

    def task(_partition):
        from pyspark import BarrierTaskContext

        from dgx_assets.spark.gpu import bind_task_gpus

        context = BarrierTaskContext.get()
        index = context.partitionId()
        binding = bind_task_gpus(context)  # CUDA_VISIBLE_DEVICES for the TensorFlow child, before it starts
        host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        endpoints = context.allGather(f"{host}:{_free_port(host)}")
        tf_config = {"cluster": {"worker": list(endpoints)}, "task": {"type": "worker", "index": index}}
        with tempfile.TemporaryDirectory(prefix=f"dgx-train-{index}-") as folder:
            spec = Path(folder) / "job.pkl"
            spec.write_bytes(
                pickle.dumps(
                    {
                        "job": job_bytes,
                        "index": index,
                        "host": host,
                        "spark_gpus": list(binding.addresses or ()),
                        "stage": context.stageId(),
                        "out": folder,
                    }
                )
            )
            log = Path(folder) / "worker.log"
            with log.open("wb") as out:
                done = subprocess.run(
                    [sys.executable, "-m", "dgx_assets.training.distributed_worker", str(spec)],
                    env=os.environ | {"TF_CONFIG": json.dumps(tf_config)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                    check=False,
                )
            tail = _last_words(log.read_bytes().decode(errors="replace"))
            print(tail, file=sys.stderr)  # the executor's log keeps the worker's last words
            if done.returncode != 0:
                raise DistributedTrainingError(
                    f"training worker {index} on {host} (stage {context.stageId()}) exited with "
                    f"{done.returncode}; its log ends:\n{tail}"
                )
            yield (Path(folder) / "result.pkl").read_bytes()

    return task


def _last_words(log: str) -> str:
    """The end of a worker's log, from its last traceback when there is one (tensors in it can be long)."""
    start = log.rfind("Traceback (most recent call last)")
    if start < 0 or len(log) - start <= _LOG_TAIL:
        return log[-_LOG_TAIL:]
    return log[start : start + _LOG_TAIL // 2] + "\n[...]\n" + log[-_LOG_TAIL // 2 :]


def _free_port(host: str) -> int:
    with closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """The TensorFlow child gets SIGKILL when the Python worker that started it dies (Linux): a killed
    barrier task must not leave a worker blocked in an all-reduce behind."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
