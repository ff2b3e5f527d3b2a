"""Hyperparameter search on a Ray cluster that lives on the run's Spark executors for the search's duration.

Plain Python (no Dagster). ``ray_on_spark`` starts Ray with ``ray.util.spark.setup_ray_cluster`` on the
given SparkSession and always tears it down, also when the search fails. ``run_search`` runs Ray Tune over
the recipe settings of trained_model's classifier head (learning rate, dropout, batch size) with an ASHA
scheduler that stops bad trials early, each trial fitting the head (dropout, then a softmax layer, trained
with Adam on class-weighted cross-entropy, as trained_model's head) on image_features' stored embeddings of
the train split, scored on the validation split. That is a proxy for the full fine-tune, seconds per trial
instead of an hour, and it is what the search promises: the best head recipe, written for trained_model.
Trials compute with numpy only, so a Ray worker never loads TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from dgx_assets.tuning.config import SearchConfig, SearchConfigError


@dataclasses.dataclass(frozen=True)
class HeadData:
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    class_weights: np.ndarray  # per class, as trained_model weights its loss


@dataclasses.dataclass
class TrialOutcome:
    trial_id: str
    config: dict[str, Any]
    history: list[dict[str, float]]  # one entry per epoch reported
    stopped_early: bool  # ASHA stopped it before max_epochs
    error: str | None = None


@dataclasses.dataclass
class SearchOutcome:
    best_config: dict[str, Any]
    best_metrics: dict[str, float]
    trials: list[TrialOutcome]
    ray_worker_nodes: int


# --- one trial: the classifier head, in numpy --------------------------------------------------------
def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def head_epochs(
    data: HeadData, learning_rate: float, dropout: float, batch_size: int, epochs: int, seed: int
) -> Iterator[dict[str, float]]:
    """Train dropout + softmax on the embeddings with Adam; yield validation loss/accuracy after each epoch."""
    rng = np.random.default_rng(seed)
    classes = len(data.class_weights)
    # Standardised inputs: embeddings' scales differ per dimension; the statistics are the train split's.
    mean, std = data.train_x.mean(axis=0), data.train_x.std(axis=0) + 1e-6
    train_x, val_x = (data.train_x - mean) / std, (data.val_x - mean) / std
    weights = rng.normal(0, 0.01, (train_x.shape[1], classes))
    bias = np.zeros(classes)
    moments = [np.zeros_like(weights), np.zeros_like(bias), np.zeros_like(weights), np.zeros_like(bias)]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(train_x))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            x, y = train_x[rows], data.train_y[rows]
            if dropout:
                x = x * (rng.random(x.shape) >= dropout) / (1 - dropout)
            probabilities = _softmax(x @ weights + bias)
            sample_weight = data.class_weights[y][:, None]
            delta = (probabilities - np.eye(classes)[y]) * sample_weight / len(rows)
            step += 1
            for i, (param, grad) in enumerate(((weights, x.T @ delta), (bias, delta.sum(axis=0)))):
                moments[i] = 0.9 * moments[i] + 0.1 * grad
                moments[i + 2] = 0.999 * moments[i + 2] + 0.001 * grad * grad
                param -= learning_rate * (moments[i] / (1 - 0.9**step)) / (np.sqrt(moments[i + 2] / (1 - 0.999**step)) + 1e-7)
        probabilities = _softmax(val_x @ weights + bias)
        picked = np.clip(probabilities[np.arange(len(data.val_y)), data.val_y], 1e-7, 1)
        yield {
            "val_loss": float(-np.mean(np.log(picked) * data.class_weights[data.val_y])),
            "val_accuracy": float(np.mean(probabilities.argmax(axis=1) == data.val_y)),
        }


def _trial(config: dict[str, Any], data: HeadData, max_epochs: int, seed: int) -> None:
    from ray import tune

    for metrics in head_epochs(data, config["learning_rate"], config["dropout"], config["batch_size"], max_epochs, seed):
        tune.report(metrics)


# --- the Ray cluster on Spark ------------------------------------------------------------------------
@contextlib.contextmanager
def ray_on_spark(spark: Any, worker_nodes: int, log: Any = None) -> Iterator[str]:
    """A Ray cluster on ``spark``'s executors (one worker node per task slot asked), connected, for the block.

    Torn down on the way out whatever happened: the driver disconnects, the Ray head and the Spark job
    holding the worker nodes are stopped."""
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    say = log or (lambda message: None)
    master = spark.sparkContext.master
    if master.startswith("k8s://"):
        raise SearchConfigError(
            f"Ray on Spark does not run on Spark on Kubernetes ({master}): run the search with "
            "DGX_DEPLOYMENT=standalone or local, or use KubeRay"
        )
    gpus = float(spark.sparkContext.getConf().get("spark.task.resource.gpu.amount", "0") or 0)
    # Ray on Spark starts its nodes with the `ray` script found on PATH; a venv that is not activated has it
    # beside its python only. Executors need it on their PATH too (an installed image or an activated venv).
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
    try:
        address, _ = setup_ray_cluster(
            max_worker_nodes=worker_nodes,
            min_worker_nodes=worker_nodes,
            num_cpus_worker_node=1,
            num_gpus_worker_node=1 if gpus >= 1 else 0,
            head_node_options={"include_dashboard": False},
            collect_log_to_path=None,
        )
        say(f"Ray cluster on Spark at {address} with {worker_nodes} worker nodes")
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        yield address
    finally:
        with contextlib.suppress(Exception):  # tear-down must reach shutdown_ray_cluster whatever failed
            ray.shutdown()
        with contextlib.suppress(Exception):
            shutdown_ray_cluster()
        say("Ray cluster on Spark shut down")


def worker_nodes(spark: Any, config: SearchConfig) -> int:
    return config.ray_worker_nodes or max(1, min(8, spark.sparkContext.defaultParallelism))


def run_search(spark: Any, data: HeadData, config: SearchConfig, log: Any = None) -> SearchOutcome:
    """The search on Ray on Spark; every trial's history comes back, the stopped ones included."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    nodes = worker_nodes(spark, config)
    space = {
        "learning_rate": tune.loguniform(config.learning_rate_min, config.learning_rate_max),
        "dropout": tune.uniform(0.0, config.dropout_max),
        "batch_size": tune.choice(list(config.batch_sizes)),
    }
    scheduler = ASHAScheduler(
        time_attr="training_iteration",
        max_t=config.max_epochs,
        grace_period=config.grace_period,
        reduction_factor=config.reduction_factor,
    )
    with ray_on_spark(spark, nodes, log), tempfile.TemporaryDirectory(prefix="ray-tune-") as storage:
        trainable = tune.with_resources(
            tune.with_parameters(_trial, data=data, max_epochs=config.max_epochs, seed=config.seed), {"cpu": 1}
        )
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric="val_loss",
                mode="min",
                num_samples=config.num_samples,
                scheduler=scheduler,
                search_alg=_seeded_search(config.seed),
            ),
            run_config=tune.RunConfig(name="hyperparameter_search", storage_path=storage, verbose=0),
        )
        results = tuner.fit()
        trials = [_outcome(result, config.max_epochs) for result in results]
    finished = [t for t in trials if t.history and t.error is None]
    if not finished:
        errors = "; ".join(sorted({t.error for t in trials if t.error}))[:2000]
        raise RuntimeError(f"every one of {len(trials)} trials failed: {errors}")
    best = min(finished, key=lambda t: min(h["val_loss"] for h in t.history))
    best_epoch = min(best.history, key=lambda h: h["val_loss"])
    return SearchOutcome(best.config, best_epoch, trials, nodes)


def _seeded_search(seed: int) -> Any:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=seed)


def _outcome(result: Any, max_epochs: int) -> TrialOutcome:
    frame = result.metrics_dataframe
    history = (
        []
        if frame is None
        else [
            {"val_loss": float(row.val_loss), "val_accuracy": float(row.val_accuracy)}
            for row in frame.itertuples()
            if math.isfinite(row.val_loss)
        ]
    )
    config = {key: (int(value) if key == "batch_size" else float(value)) for key, value in result.config.items()}
    trial_id = str(result.metrics.get("trial_id", "")) if result.metrics else ""
    return TrialOutcome(
        trial_id,
        config,
        history,
        stopped_early=0 < len(history) < max_epochs,
        error=None if result.error is None else f"{type(result.error).__name__}: {result.error}"[:500],
    )
