"""trained_model (Keras, tracked in MLflow): the Dagster layer.

Thin on purpose: the work is in dgx_assets/training/ (train.py, tracking.py). No TensorFlow, PySpark or MLflow
import at module level: the code location imports this on every sensor tick.
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from dgx_assets import metadata
from dgx_assets.config_parts import part_of
from dgx_assets.defs.model.checks import MODEL_GATE_CHECK, ModelGateSettings, model_gate_result
from dgx_assets.defs.model.inputs import current_feature_input
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.k8s import gpu_step_tags
from dgx_assets.training.config import TrainConfig, human_epoch
from dgx_assets.tuning.best_config import SEARCH_ASSET

TRAINED_MODEL_CODE_VERSION = "7"  # up when the same inputs would train another model: docs/decisions/0004


class TrainedModelConfig(dg.Config, TrainConfig, ModelGateSettings):
    checkpoint_dir: Optional[str] = Field(
        None, description="Where per-epoch checkpoints live so an interrupted run resumes; default <DGX state>/checkpoints"
    )
    use_searched_hyperparameters: bool = Field(
        False, description="Take learning_rate, dropout and batch_size from hyperparameter_search's best_config.json"
    )

    def train_config(self) -> TrainConfig:
        return part_of(self, TrainConfig)


# Trains the defect classifier on every image_features batch, tracked in MLflow; registers the version as `candidate`.
@dg.asset(
    deps=[
        dg.AssetDep("image_features", partition_mapping=dg.AllPartitionMapping()),
        # Read only with use_searched_hyperparameters: a declared edge, not an input, so trained_model runs
        # without it (make demo leaves the search out) and the UI shows when a newer search makes it stale.
        dg.AssetDep(SEARCH_ASSET),
    ],
    group_name="model",
    kinds={"tensorflow", "mlflow"},
    owners=["team:ml-platform"],
    code_version=TRAINED_MODEL_CODE_VERSION,
    check_specs=[MODEL_GATE_CHECK],
    op_tags={
        **gpu_step_tags(gpus=1),  # the step pod on a GPU node under dagster-k8s; ignored elsewhere
        # The longest step starts first among those ready, so the shorter ones (and the local generator's
        # background build the generation step waits for) do not hold it back.
        "dagster/priority": "10",
    },
    description=(
        "A Keras defect classifier trained on all image_features batches (MirroredStrategy over the visible GPUs, "
        "one CPU replica otherwise; early stopping on the validation split; resumable checkpoints) and evaluated "
        "on the test split. Writes `<lake>/trained_model/model.keras` (float32 pixels 0..255 in, softmax out) and "
        "model_info.json; one MLflow run with datasets, metrics, plots and hardware baseline; the registered "
        "version gets the alias `candidate`. With `use_searched_hyperparameters` it takes learning rate, dropout and "
        "batch size from hyperparameter_search's best_config.json; its metadata says whether it did."
    ),
)
def trained_model(
    context: dg.AssetExecutionContext,
    config: TrainedModelConfig,
    lake: LakeResource,
    mlflow: MlflowResource,
    spark: SparkResource,
) -> dg.MaterializeResult:
    from pathlib import Path

    from dgx_assets import settings
    from dgx_assets.training.config import ModelConfigError
    from dgx_assets.training.dataset import FeatureDataError
    from dgx_assets.training.outputs import model_info, write_model_outputs
    from dgx_assets.training.tracking import TrackingConfigError, train_and_track

    store = lake.lake
    files, partitions, _, lineage = current_feature_input(context, store, TRAINED_MODEL_CODE_VERSION)
    tracking = mlflow.tracking_config()
    checkpoints = config.checkpoint_dir or str(Path(settings.environment().state_dir) / "checkpoints" / "trained_model")
    context.log.info(f"Training on {len(files.paths)} files of image_features {partitions} (snapshot {files.snapshot_id})")
    distribution, trainer = _trainer_for(context, config, spark)
    train_config = config.train_config().model_copy(update={"distribution": distribution})
    searched = None
    if config.use_searched_hyperparameters:
        from dgx_assets.tuning.best_config import apply_best_config

        try:
            train_config, searched = apply_best_config(store, train_config)
        except ValueError as error:
            raise dg.Failure(str(error)) from error
        context.log.info(f"Searched hyperparameters {searched['hyperparameters']} (MLflow run {searched['mlflow_run_id']})")
    features_table = store.tables.table("image_features")
    assert features_table is not None  # current_features found its files
    try:
        tracked = train_and_track(
            files,
            features_table.location(),
            train_config,
            tracking,
            checkpoints,
            lineage,
            log=context.log.info,
            trainer=trainer,
        )
    except (ModelConfigError, TrackingConfigError, FeatureDataError) as error:
        raise dg.Failure(str(error)) from error

    info = model_info(tracked, tracking.tracking_uri, store, list(partitions), files.snapshot_id)
    folder = write_model_outputs(store, tracked, info)
    return dg.MaterializeResult(
        metadata=_trained_model_metadata(tracked, tracking, files, partitions, searched, folder),
        check_results=[model_gate_result(info, tracking.tracking_uri, config)],
    )


def _trainer_for(context: dg.AssetExecutionContext, config: TrainedModelConfig, spark: SparkResource):
    """The distribution to train with, and its trainer (None: train_classifier in this process)."""
    from dgx_assets import settings
    from dgx_assets.training.distributed import resolve_distribution

    distribution = resolve_distribution(config.distribution, settings.environment().deployment)
    if distribution != "spark":
        return distribution, None
    import functools

    from dgx_assets.training.distributed import train_on_spark

    # The run's SparkSession starts only here: single training never needs it.
    context.log.info("Training on Spark executors (barrier stage, MultiWorkerMirroredStrategy)")
    return distribution, functools.partial(train_on_spark, spark.spark_session)


def _trained_model_metadata(tracked, tracking, files, partitions, searched, folder) -> dict:
    from dgx_assets import links

    metrics = tracked.training.test.metrics
    version_url = links.mlflow_model_version(tracking.ui_url, tracked.model_name, tracked.model_version)
    return {
        **({"mlflow_run": dg.MetadataValue.url(tracked.run_url)} if tracked.run_url else {}),
        "mlflow_model_version": dg.MetadataValue.url(version_url),
        "mlflow_run_id": tracked.run_id,
        "mlflow_tracking_uri": tracking.tracking_uri,
        "model_version": f"{tracked.model_name} v{tracked.model_version} (alias candidate)",
        "model_uri": tracked.model_uri,
        "test_accuracy": metadata.number(metrics["accuracy"]),
        "majority_baseline_accuracy": metadata.number(metrics["majority_baseline_accuracy"]),
        "test_roc_auc": metadata.number(metrics["roc_auc"]),
        "test_macro_f1": metadata.number(metrics["macro_f1"]),
        "confusion_matrix": metadata.confusion(tracked.training.test.confusion_matrix, tracked.training.class_names),
        "epochs_run": len(tracked.training.epochs),
        "best_epoch": human_epoch(tracked.training.best_epoch),  # counted from 1, as people count
        "resumed_from_epoch": tracked.training.resumed_from_epoch,
        "training_seconds": round(tracked.training.seconds, 1),
        "hardware": f"{tracked.hardware['kind']}: "
        + ("; ".join(tracked.hardware["gpus"]) or f"{tracked.hardware['cpu_model']} x{tracked.hardware['cpu_cores']}"),
        "strategy": f"{tracked.training.strategy} x{tracked.training.replicas} ({tracked.training.precision_policy})",
        "partitions": ", ".join(partitions),
        "data_digest": tracked.data_digest,
        "image_features_snapshot_id": str(files.snapshot_id),
        **searched_metadata(searched),
        "path": dg.MetadataValue.path(folder),
    }


def searched_metadata(searched: Optional[dict]) -> dict:
    """Whether trained_model took hyperparameter_search's recipe and, if so, which values from which search."""
    if searched is None:
        return {"used_searched_hyperparameters": False}
    return {
        "used_searched_hyperparameters": True,
        "searched_hyperparameters": dg.MetadataValue.json(searched["hyperparameters"]),
        "hyperparameter_search_mlflow_run_id": str(searched.get("mlflow_run_id", "")),
    }
