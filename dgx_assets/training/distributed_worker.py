"""The TensorFlow worker of distributed training (``distributed``): a child process of its barrier task
(``distributed_task``), run as ``python -m dgx_assets.training.distributed_worker <spec>`` with ``TF_CONFIG`` set.
Every worker trains on its own shard and validates on the whole validation split; worker 0, the chief, writes the
per-epoch checkpoint into the shared checkpoint directory and its final model travels back to the driver."""

from __future__ import annotations

import json
import math
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from dgx_assets.training.dataset import FeatureFiles, Shard
from dgx_assets.training.distributed_job import CHIEF, TrainingJob, WorkerReport

_WEIGHTS, _STATE = "latest.weights.h5", "training_state.json"


def run_worker(spec_path: str) -> None:
    """Train this worker's shard as the job in ``spec_path`` says and write its result beside it."""
    spec = pickle.loads(Path(spec_path).read_bytes())
    job: TrainingJob = pickle.loads(spec["job"])
    config, index, worker = job.config, job.index, spec["index"]
    shard = job.shards[worker]

    import keras
    import tensorflow as tf

    from dgx_assets.training import train

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
    if config.warm_starts_head:
        # Deterministic (the same embeddings and seed on every worker), so all workers start from one head.
        head_start = train.warm_start_head(model, job.files, index, config)  # the job's config is resolved

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


def _worker_datasets(job: TrainingJob, shard, global_batch: int) -> tuple[Any, Any]:
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
    """(step counter, checkpoint writer). Built here, not at module level: importing this module imports no
    TensorFlow; the worker imports it in `run_worker`, once its job is read."""
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
    run_worker(sys.argv[1])
