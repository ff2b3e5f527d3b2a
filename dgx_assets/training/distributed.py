"""trained_model across Spark executors: one barrier stage of N tasks, each a TensorFlow
MultiWorkerMirroredStrategy worker.

Why our own runner and not spark-tensorflow-distributor's MirroredStrategyRunner (1.0.0, the last release,
2021): it reads ``spark.task.resource.gpu.amount`` with ``int()``, so our profiles' fractional 0.25 fails
before training starts; it picks GPUs with ``random.sample`` and sets ``CUDA_VISIBLE_DEVICES`` in a reused
Python worker without noticing that TensorFlow (and CUDA) may already be up there; it runs TensorFlow inside
the Python worker, whose collective-ops server cannot be started a second time when Spark retries the stage;
and it has no say over the stage's resources.

How it runs:

- The driver (the Dagster step) plans disjoint shards of the image_features files (whole Parquet row groups),
  submits ``parallelize(range(N), N).barrier()`` as a shuffle-map stage (the only kind Spark retries) with
  one task per executor (a stage-level resource profile
  asks each task for one whole GPU and all the executor's cores where executors have GPUs) and collects.
- Each barrier task binds its GPU as the feature job does (``spark.gpu.bind_task_gpus``), finds a free port,
  all-gathers ``host:port`` from every task into ``TF_CONFIG`` and starts the TensorFlow worker as a child
  process: a fresh process per attempt, so a retried stage never meets TensorFlow state of a dead one, and the
  child dies with the Python worker Spark kills (``PR_SET_PDEATHSIG``).
- Every worker trains on its own shard (repeated, the same number of steps per epoch on all workers) and
  validates on the whole validation split (identical metrics on every worker, so early stopping stops all of
  them at the same epoch). Worker 0 is the chief: it writes the per-epoch checkpoint into the shared
  checkpoint directory (written aside, then renamed) and the final model, which travels back to the driver
  in the task result. The driver evaluates the test split and hands back a ``TrainingResult``.
- A worker lost mid-training fails its task; Spark then retries the whole barrier stage
  (``spark.stage.maxConsecutiveAttempts``), and every worker restores the chief's last checkpoint and goes on
  from the epoch after it. The checkpoint directory must be shared by all executors (NFS, Lustre, a PVC).

This module is the driver; the barrier task is ``distributed_task``, the TensorFlow worker
``distributed_worker``, and what the three hand each other ``distributed_job``.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dgx_assets.training.config import TrainConfig
from dgx_assets.training.dataset import (
    FeatureFiles,
    FeatureIndex,
    Shard,
    make_dataset,
    scan_features,
)
from dgx_assets.training.distributed_job import CHIEF, DistributedTrainingError, TrainingJob, WorkerReport
from dgx_assets.training.distributed_task import barrier_task
from dgx_assets.training.model import model_from_bytes
from dgx_assets.training.train import EpochCallback, TrainingResult


@dataclasses.dataclass
class DistributedTrainingResult(TrainingResult):
    workers: list[WorkerReport] = dataclasses.field(default_factory=list)
    stage_attempt: int = 0  # 0: the first attempt of the barrier stage succeeded
    sharding: str = ""  # "row groups" or "row stride"
    startup_seconds: float = math.nan  # from submitting the stage to the first step of the slowest worker

    @property
    def params(self) -> dict[str, Any]:
        return super().params | {"workers": len(self.workers), "sharding": self.sharding}


# --- the driver ------------------------------------------------------------------------------------------
def resolve_distribution(distribution: str, deployment: str) -> str:
    """``auto`` is ``spark`` on a cluster deployment (standalone, k8s) and ``single`` on a laptop (local)."""
    if distribution == "auto":
        return "single" if deployment == "local" else "spark"
    return distribution


def executor_count(session: Any, wait_s: float = 60.0, settle_s: float = 3.0) -> int:
    """Executors registered with the driver; 1 in local mode, where the tasks run in the driver's JVM. Waits
    (at most ``wait_s``) for the number the session asked for (local-cluster[N,..], spark.executor.instances),
    or else until the count has not changed for ``settle_s``: executors register one by one after start-up."""
    import re

    sc = session.sparkContext
    if sc.master.startswith("local["):
        return 1
    cluster = re.match(r"local-cluster\[(\d+),", sc.master)
    expected = int(cluster.group(1)) if cluster else int(sc.getConf().get("spark.executor.instances", "0") or 0)
    deadline = time.monotonic() + wait_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1  # the list holds the driver too
        if now != count:
            count, since = now, time.monotonic()
        if count > 0 and (count >= expected > 0 or (not expected and time.monotonic() - since >= settle_s)):
            break
        time.sleep(0.25)
    if count < 1:
        raise DistributedTrainingError(
            f"no Spark executor registered with the driver within {wait_s:.0f} s "
            f"(master {sc.master}): start workers or use distribution 'single'"
        )
    return count


def plan_shards(files: FeatureFiles, workers: int) -> tuple[list[Shard], str]:
    """Disjoint shards, one per worker: whole row groups balanced by rows (largest first to the least loaded
    worker), or, when there are fewer row groups than workers, every ``workers``-th row."""
    import pyarrow.parquet as pq

    units = []
    for path in files.paths:
        with files.filesystem.open_input_file(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
        units += [(metadata.row_group(g).num_rows, path, g) for g in range(metadata.num_row_groups)]
    if len(units) < workers:
        return [Shard(i, workers) for i in range(workers)], "row stride"
    loads = [[0, []] for _ in range(workers)]
    for rows, path, group in sorted(units, key=lambda u: (-u[0], u[1], u[2])):
        least = min(loads, key=lambda load: load[0])
        least[0] += rows
        least[1].append((path, group))
    return [Shard(i, workers, tuple(sorted(groups))) for i, (_, groups) in enumerate(loads)], "row groups"


def train_on_spark(
    session: Any,
    files: FeatureFiles,
    config: TrainConfig,
    checkpoint_dir: str,
    *,
    on_epoch_end: EpochCallback | None = None,
    extra_callbacks: Sequence[Any] = (),
    index: FeatureIndex | None = None,
    workers: int | None = None,
) -> DistributedTrainingResult:
    """Train on ``workers`` Spark barrier tasks (default: one per executor) and evaluate on the test split
    here. Same inputs and result as ``train.train_classifier``; ``extra_callbacks`` run in every worker."""
    from pyspark import BarrierTaskContext  # noqa: F401  (fails early where pyspark is missing)

    config = config.resolved().model_copy(update={"distribution": "spark"})
    index = index or scan_features(files)
    workers = workers or executor_count(session)
    shards, sharding = plan_shards(files, workers)
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    job = TrainingJob(files, config, index, shards, str(Path(checkpoint_dir).resolve()), list(extra_callbacks))
    started_at, started = time.time(), time.monotonic()

    sc = session.sparkContext
    from pyspark import cloudpickle  # by value: callbacks defined in a function (tests, notebooks) travel too

    rdd = sc.parallelize(range(workers), workers).barrier().mapPartitions(barrier_task(cloudpickle.dumps(job)))
    profile = _one_task_per_gpu_executor(sc)
    if profile is not None:
        rdd = rdd.withResources(profile)
    # Spark retries a failed barrier stage only when it is a shuffle-map stage (a failed barrier result stage
    # aborts the job), so the results cross one small shuffle before they are collected.
    reports = [pickle.loads(payload) for payload in rdd.repartition(1).collect()]

    chief = next(report for report in reports if report["worker"].index == CHIEF)
    model = model_from_bytes(chief["model"])
    for epoch in chief["epochs"]:  # the workers' epochs reach MLflow once the stage is done
        if on_epoch_end:
            on_epoch_end(epoch, {key: values[chief["epochs"].index(epoch)] for key, values in chief["history"].items()})
    from dgx_assets.training.train import choose_decision, evaluate

    batch = config.batch_size * chief["replicas"]
    decision = choose_decision(model, files, index, config, batch)  # on the driver, as single training does
    test = evaluate(model, make_dataset(files, index, "test", batch), index, decision)
    worker_reports = sorted((report["worker"] for report in reports), key=lambda w: w.index)
    class_weights = index.class_weights() if config.class_weighting else None
    return DistributedTrainingResult(
        model=model,
        class_names=list(index.class_names),
        input_shape=list(index.tensor_shape),
        history=chief["history"],
        epochs=chief["epochs"],
        resumed_from_epoch=chief["resumed_from_epoch"],
        best_epoch=chief["best_epoch"],
        test=test,
        strategy="MultiWorkerMirroredStrategy",
        replicas=chief["replicas"],
        precision_policy=chief["precision_policy"],
        split_counts=index.counts,
        class_weights={name: round((class_weights or {}).get(i, 1.0), 6) for i, name in enumerate(index.class_names)},
        seconds=time.monotonic() - started,
        head_warm_start=chief["head_warm_start"],
        decision=decision,
        workers=worker_reports,
        stage_attempt=_stage_attempt(sc, chief["worker"].stage),
        sharding=sharding,
        startup_seconds=max(w.first_step_at for w in worker_reports) - started_at,
    )


def _stage_attempt(sc: Any, stage: int) -> int:
    """The attempt of the barrier stage that finished (above 0 when Spark retried it after a lost worker)."""
    info = sc.statusTracker().getStageInfo(stage)
    return int(info.currentAttemptId) if info is not None else 0


def _one_task_per_gpu_executor(sc: Any) -> Any:
    """Where executors have GPUs: each training task takes a whole GPU and all the executor's cores, so the
    barrier stage puts exactly one worker on each executor (feature jobs share a GPU by a fractional amount)."""
    conf = sc.getConf()
    if not conf.get("spark.executor.resource.gpu.amount", None):
        return None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    cores = int(conf.get("spark.executor.cores", "1"))
    gpus = int(float(conf.get("spark.executor.resource.gpu.amount")))
    return ResourceProfileBuilder().require(TaskResourceRequests().cpus(cores).resource("gpu", gpus)).build
