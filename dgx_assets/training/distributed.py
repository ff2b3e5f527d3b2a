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
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
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
from dgx_assets.training.train import EpochCallback, TrainingResult

CHIEF = 0
_WEIGHTS, _STATE = "latest.weights.h5", "training_state.json"
_LOG_TAIL = 4000


class DistributedTrainingError(RuntimeError):
    """Distributed training cannot start or a worker failed; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class WorkerReport:
    """What one barrier task did, as its TensorFlow worker saw it."""

    index: int
    host: str
    pid: int
    spark_gpus: list[str]  # addresses Spark assigned the task
    cuda_visible_devices: str | None  # what the TensorFlow worker process was started with
    tensorflow_gpus: int  # GPUs TensorFlow saw in it
    shard_rows: int  # training rows of this worker's shard
    steps: int  # training steps this worker took in the final attempt
    first_step_at: float  # wall clock (epoch seconds) when its first step ended
    stage: int  # the barrier stage's id


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

    config.check()
    config = config.resolved().model_copy(update={"distribution": "spark"})
    index = index or scan_features(files)
    workers = workers or executor_count(session)
    shards, sharding = plan_shards(files, workers)
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    job = _Job(files, config, index, shards, str(Path(checkpoint_dir).resolve()), list(extra_callbacks))
    started_at, started = time.time(), time.monotonic()

    sc = session.sparkContext
    from pyspark import cloudpickle  # by value: callbacks defined in a function (tests, notebooks) travel too

    rdd = sc.parallelize(range(workers), workers).barrier().mapPartitions(_barrier_task(cloudpickle.dumps(job)))
    profile = _one_task_per_gpu_executor(sc)
    if profile is not None:
        rdd = rdd.withResources(profile)
    # Spark retries a failed barrier stage only when it is a shuffle-map stage (a failed barrier result stage
    # aborts the job), so the results cross one small shuffle before they are collected.
    reports = [pickle.loads(payload) for payload in rdd.repartition(1).collect()]

    chief = next(report for report in reports if report["worker"].index == CHIEF)
    model = _load_model(chief["model"])
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


def _load_model(data: bytes) -> Any:
    import keras

    with tempfile.TemporaryDirectory(prefix="dgx-model-") as folder:
        path = Path(folder) / "model.keras"
        path.write_bytes(data)
        return keras.models.load_model(path)


# --- the barrier task (a Spark Python worker) ------------------------------------------------------------
@dataclasses.dataclass
class _Job:
    files: FeatureFiles
    config: TrainConfig
    index: FeatureIndex
    shards: list[Shard]
    checkpoint_dir: str
    extra_callbacks: list[Any]


def _barrier_task(job_bytes: bytes):
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
                    [sys.executable, "-m", "dgx_assets.training.distributed", str(spec)],
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


# --- the TensorFlow worker (a child of the barrier task) ------------------------------------------------
def _run_worker(spec_path: str) -> None:
    spec = pickle.loads(Path(spec_path).read_bytes())
    job: _Job = pickle.loads(spec["job"])
    config, index, worker = job.config, job.index, spec["index"]
    shard = job.shards[worker]

    import keras
    import tensorflow as tf

    from dgx_assets.training import train
    from dgx_assets.training.config import EFFICIENTNET_LITE0

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    # First: collective ops must be configured before TensorFlow's runtime starts. The cluster is TF_CONFIG's.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    policy = "mixed_float16" if gpus and config.mixed_precision == "auto" else "float32"
    model = train.compiled_classifier(config, index, strategy, policy)
    head_start = None
    if config.backbone == EFFICIENTNET_LITE0 and config.head_warm_start:
        assert config.class_weighting is not None  # the job's config is resolved
        # Deterministic (the same embeddings and seed on every worker), so all workers start from one head.
        head_start = train.warm_start_head(model, job.files, index, config.seed, balanced=config.class_weighting)

    checkpoints = Path(job.checkpoint_dir)
    initial_epoch = _restore(model, checkpoints)
    global_batch = config.batch_size * strategy.num_replicas_in_sync
    weights = index.class_weights() if config.class_weighting else None
    train_data, validation_data = _worker_datasets(job, shard, global_batch)

    _work_around_keras_multi_worker(model, strategy, next(iter(validation_data.take(1))))
    counter, checkpoint = _worker_callbacks(checkpoints, worker == CHIEF, Path(spec["out"]) / "checkpoint")
    recorder = train._epoch_recorder(None)
    early_stopping = train._early_stopping(config)
    model.fit(
        train_data.repeat(),
        validation_data=validation_data,
        class_weight=weights,
        steps_per_epoch=train.steps_per_epoch(index, global_batch),
        epochs=config.epochs,
        initial_epoch=initial_epoch,
        callbacks=[checkpoint, early_stopping, train._learning_rate_schedule(config), recorder, counter, *job.extra_callbacks],
        verbose=0,
    )
    # Every worker saves (collective-safe: all take part in whatever the save reads); the chief's is kept.
    model_path = Path(spec["out"]) / "model.keras"
    model.save(model_path)
    report = WorkerReport(
        index=worker,
        host=spec["host"],
        pid=os.getpid(),
        spark_gpus=spec["spark_gpus"],
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        tensorflow_gpus=len(gpus),
        shard_rows=_shard_rows(job.files, shard, "train"),
        steps=counter.steps,
        first_step_at=counter.first_step_at or math.nan,
        stage=spec["stage"],
    )
    result = {"worker": report}
    if worker == CHIEF:
        best_epoch = early_stopping.best_epoch if early_stopping.best_weights is not None else None
        result |= {
            "model": model_path.read_bytes(),
            "history": recorder.history,
            "epochs": recorder.epochs,
            "resumed_from_epoch": initial_epoch,
            "best_epoch": None if best_epoch is None else int(best_epoch),
            "replicas": int(strategy.num_replicas_in_sync),
            "precision_policy": policy,
            "head_warm_start": head_start,
        }
        for name in (_WEIGHTS, _STATE):  # done: the next run with this fingerprint starts afresh
            (checkpoints / name).unlink(missing_ok=True)
    (Path(spec["out"]) / "result.pkl").write_bytes(pickle.dumps(result))


def _worker_datasets(job: _Job, shard, global_batch: int) -> tuple[Any, Any]:
    """This worker's training shard (repeated by the caller) and the whole validation split."""
    import tensorflow as tf

    from dgx_assets.training import train

    config, index = job.config, job.index
    # Each worker reads its own shard (and the whole validation split), so TensorFlow must not shard again.
    # Keras splits every batch of `global_batch` rows into per-replica batches: a step on a worker takes
    # `per_replica` rows of its own shard.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train_data, validation_data = train.training_datasets(job.files, index, config, global_batch, shard)
    return train_data.with_options(options), validation_data.with_options(options)


def _work_around_keras_multi_worker(model: Any, strategy: Any, local_batch: Any) -> None:
    """Keras 3's fit does not run under MultiWorkerMirroredStrategy as released (keras-team/keras#20585,
    tensorflow/tensorflow#72388): it reduces a first distributed batch across workers to build the optimizer
    and metric state, and reduces each step's scalar logs with ``axis=0``; both raise. Gradients are not
    affected (the optimizer all-reduces them in the step). So, in this worker process only: build that state
    from a local batch, and reduce logs over this worker's replicas, as MirroredStrategy does. Logs are then
    this worker's: the validation metrics are the same on every worker (each validates on the whole split)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    with strategy.scope():
        model._symbolic_build(data_batch=local_batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    tf_trainer._collective_all_reduce_multi_worker = lambda _strategy: False


def _restore(model: Any, checkpoints: Path) -> int:
    """The epoch to start from: after the chief's last checkpoint (whose weights are loaded), else 0."""
    state = checkpoints / _STATE
    if not state.exists():
        return 0
    model.load_weights(checkpoints / _WEIGHTS)
    return int(json.loads(state.read_text())["epoch"])


def _worker_callbacks(shared: Path, chief: bool, private: Path) -> tuple[Any, Any]:
    """(step counter, checkpoint writer). Built here, not at module level: the barrier task imports this module
    in a Spark Python worker, which must not import TensorFlow (the child does, after the GPU binding)."""
    import keras

    class StepCounter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps, self.first_step_at = 0, None

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.first_step_at is None:
                self.first_step_at = time.time()

    class ChiefCheckpoint(keras.callbacks.Callback):
        """After each epoch the chief writes the weights and the next epoch into the shared directory, each
        written aside and renamed; the other workers write theirs into a private folder (the same call on every
        worker, as collective ops need) and throw them away."""

        def on_epoch_end(self, epoch, logs=None):
            folder = shared if chief else private
            folder.mkdir(parents=True, exist_ok=True)
            aside = folder / f".{os.getpid()}.{_WEIGHTS}"
            assert self.model is not None  # set by fit() before any epoch ends
            self.model.save_weights(aside)
            os.replace(aside, folder / _WEIGHTS)
            state = folder / f".{os.getpid()}.{_STATE}"
            state.write_text(json.dumps({"epoch": epoch + 1}))
            os.replace(state, folder / _STATE)

    return StepCounter(), ChiefCheckpoint()


def _shard_rows(files: FeatureFiles, shard: Shard, split: str) -> int:
    import pyarrow.dataset as pads

    scan_filter = (pads.field("split") == split) & (pads.field("feature_status") == "ok")
    return sum(batch.num_rows for batch in shard.record_batches(files, list(files.paths), ["label"], scan_filter))


if __name__ == "__main__":
    # Through the package, not __main__: the result pickles WorkerReport under its importable name.
    from dgx_assets.training import distributed

    distributed._run_worker(sys.argv[1])
