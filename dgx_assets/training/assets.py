"""image_features (Spark executors, GPU-bound) and trained_model (Keras + MLflow): the Dagster layer.

Thin on purpose: the work is in features.py, train.py and tracking.py. No TensorFlow, PySpark or MLflow
import at module level: the code location imports this on every sensor tick.
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from dgx_assets import metadata
from dgx_assets.config_parts import part_of
from dgx_assets.k8s import gpu_step_tags
from dgx_assets.partitions import BatchResult, batch_backfill_policy, image_batches, materialize_batches
from dgx_assets.resources import LakeResource, MlflowResource
from dgx_assets.spark.resource import SparkResource
from dgx_assets.training.checks import MODEL_GATE_CHECK, ModelGateSettings, model_gate_result
from dgx_assets.training.config import FeatureConfig, TrainConfig, human_epoch
from dgx_assets.tuning.best_config import SEARCH_ASSET

TRAINING_OWNERS = ["team:ml-platform"]
TRAINING_GROUP = "training"
FEATURES_CODE_VERSION = "1"
TRAINED_MODEL_CODE_VERSION = "6"  # 5: the 4 quarter turns; 6: 5 epochs
# What each image_features column means, for the column schema the UI shows.
IMAGE_FEATURES_COLUMNS = {
    "sha256": "content hash of the source image (its id)",
    "path": "the source file in the landing zone",
    "batch": "the landing batch the image came in (the table's partition)",
    "label": "class",
    "split": "train / validation / test",
    "source_width": "pixels of the source image",
    "source_height": "pixels of the source image",
    "tensor": "model input as uint8 bytes, row-major (height, width, channels)",
    "tensor_shape": "[height, width, channels] of `tensor`",
    "brightness": "mean grey level, 0..1",
    "contrast": "RMS contrast (standard deviation of the grey level), 0..1",
    "sharpness": "variance of the Laplacian of the grey level",
    "embedding": "pretrained backbone features (null when no embedding is configured)",
    "feature_status": "`ok` or `error`",
    "feature_error": "why, when feature_status is `error`",
    "feature_device": "where it was computed (gpu:<address> or cpu)",
}


class ImageFeaturesConfig(dg.Config, FeatureConfig):
    max_failed_share: float = Field(0.02, description="Fail the run when more of the valid images than this cannot be featurised")

    def feature_config(self) -> FeatureConfig:
        return part_of(self, FeatureConfig)


# Turns one raw_images batch into model-ready tensors and image statistics on Spark executors (GPU when assigned).
@dg.asset(
    partitions_def=image_batches,
    deps=["raw_images"],
    group_name=TRAINING_GROUP,
    kinds={"spark", "tensorflow"},
    owners=TRAINING_OWNERS,
    code_version=FEATURES_CODE_VERSION,
    automation_condition=dg.AutomationCondition.eager(),
    backfill_policy=batch_backfill_policy,
    description=(
        "Model-ready features of the valid images of one raw_images batch, computed in Spark executors' Python "
        "workers with TensorFlow, each worker bound to the GPU Spark assigned its task: decoded, converted to the "
        "model's channels, resized; stored as uint8 bytes (`tensor`, shape in `tensor_shape`) with brightness, "
        "contrast and sharpness, and the 1,280-d embedding of a pretrained ImageNet EfficientNet-Lite0 (`embedding`). "
        "Kept fresh after new raw_images batches."
    ),
)
def image_features(
    context: dg.AssetExecutionContext, config: ImageFeaturesConfig, spark: SparkResource, lake: LakeResource
) -> dg.MaterializeResult:
    # A backfill run featurises its batches one after the other in the run's one SparkSession.
    return materialize_batches(
        context,
        lambda batch: _featurise_batch(context, batch, config, spark, lake),
        lambda batch, result: {"rows": result.metadata["dagster/row_count"], "failed_rows": result.metadata["failed_rows"]},
    )


def _featurise_batch(
    context: dg.AssetExecutionContext, batch: str, config: ImageFeaturesConfig, spark: SparkResource, lake: LakeResource
) -> BatchResult:
    from dgx_assets.spark.progress import spark_progress
    from dgx_assets.training.config import FeatureConfigError
    from dgx_assets.training.features import FEATURE_SCHEMA, build_image_features

    store = lake.lake
    raw = store.tables.snapshot("raw_images", batch=batch)
    if not raw.uris:
        raise dg.Failure(f"the table raw_images holds no rows of batch {batch!r}: materialize raw_images for it first")
    feature_config = config.feature_config()
    try:
        feature_config.check()
    except FeatureConfigError as error:
        raise dg.Failure(str(error)) from error

    context.log.info(f"Featurising raw_images[{batch}] (snapshot {raw.snapshot_id}) into the table image_features")
    session = spark.spark_session
    done = {}

    def write(folder: str) -> list[str]:
        with spark_progress(session, context.log.info):
            done["summary"], files = build_image_features(session, raw, folder, feature_config, lake.table_writer)
        _refuse_failed_share(done["summary"], batch, config.max_failed_share)
        return files

    snapshot_id = store.tables.write_and_commit("image_features", FEATURE_SCHEMA, write, batch, context.run_id)
    summary = done["summary"]
    overview = _feature_overview(store, batch, snapshot_id)
    context.log.info(f"image_features[{batch}]: {summary.feature_rows} rows on {summary.devices}")
    return BatchResult(
        metadata={
            "dagster/row_count": summary.feature_rows,
            "failed_rows": summary.failed_rows,
            "tensor_shape": dg.MetadataValue.json(summary.tensor_shape),
            "devices": dg.MetadataValue.json(summary.devices),
            metadata.COLUMN_SCHEMA: metadata.column_schema(FEATURE_SCHEMA, IMAGE_FEATURES_COLUMNS),
            "label_counts": metadata.counts(overview["labels"], "label", "images"),
            "split_counts": metadata.counts(overview["splits"], "split", "images"),
            "image_statistics": metadata.table(
                ["statistic", "mean", "std"], [[name, v["mean"], v["std"]] for name, v in overview["statistics"].items()]
            ),
            "embedding": config.embedding,
            **metadata.table_snapshot(store, "image_features", snapshot_id),
            "raw_images_snapshot_id": str(raw.snapshot_id),
        }
    )


def _refuse_failed_share(summary, batch: str, max_failed_share: float) -> None:
    if summary.valid_rows == 0:
        raise dg.Failure(f"raw_images[{batch}] has no valid images: nothing to featurise (see its quarantine counts)")
    if summary.failed_rows / summary.valid_rows > max_failed_share:
        raise dg.Failure(
            f"{summary.failed_rows} of {summary.valid_rows} valid images of batch {batch!r} could not be featurised "
            f"(more than max_failed_share={max_failed_share}); nothing was committed. See feature_error in the run's "
            "logs, fix the images or raise max_failed_share"
        )


def _feature_overview(store, batch: str, snapshot_id: int) -> dict:
    """Counts and mean statistics from the small columns of the committed batch."""
    from collections import Counter

    from pyiceberg.expressions import EqualTo

    columns = ["label", "split", "feature_status", "brightness", "contrast", "sharpness"]
    frame = store.tables.scan("image_features", columns, EqualTo("batch", batch), snapshot_id).to_pandas()  # pyright: ignore[reportCallIssue]
    ok = frame[frame["feature_status"] == "ok"]
    return {
        "labels": dict(sorted(Counter(ok["label"]).items())),
        "splits": dict(sorted(Counter(ok["split"]).items())),
        "statistics": {
            name: {"mean": round(float(ok[name].mean()), 5), "std": round(float(ok[name].std()), 5)}
            for name in ("brightness", "contrast", "sharpness")
        }
        if len(ok)
        else {},
    }


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
    group_name=TRAINING_GROUP,
    kinds={"tensorflow", "mlflow"},
    owners=TRAINING_OWNERS,
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
    from dgx_assets.training.dataset import FeatureDataError, current_features
    from dgx_assets.training.outputs import model_info, write_model_outputs
    from dgx_assets.training.tracking import DagsterLineage, TrackingConfigError, train_and_track

    store = lake.lake
    try:
        files, partitions, _ = current_features(store)
    except FeatureDataError as error:
        raise dg.Failure(str(error)) from error
    tracking = mlflow.tracking_config()
    lineage = DagsterLineage(
        run_id=context.run_id,
        asset_key=context.asset_key.to_user_string(),
        partition_keys=tuple(partitions),
        code_version=TRAINED_MODEL_CODE_VERSION,
        job_name=context.job_name,
    )
    checkpoints = config.checkpoint_dir or str(Path(settings.state_dir()) / "checkpoints" / "trained_model")
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

    distribution = resolve_distribution(config.distribution, spark.deployment or settings.deployment())
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
