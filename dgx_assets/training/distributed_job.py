"""What the driver, the barrier tasks and the TensorFlow workers of distributed training (``distributed``) hand
each other: the job, the chief's index, each worker's report and the error that says where training failed."""

from __future__ import annotations

import dataclasses
from typing import Any

from dgx_assets.training.config import TrainConfig
from dgx_assets.training.dataset import FeatureFiles, FeatureIndex, Shard

CHIEF = 0


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
class TrainingJob:
    """What every worker of one distributed training needs, pickled by the driver for the barrier tasks."""

    files: FeatureFiles
    config: TrainConfig
    index: FeatureIndex
    shards: list[Shard]
    checkpoint_dir: str
    extra_callbacks: list[Any]
