"""challenger_model: the Dagster layer over challenger/tracking.py (no pyspark, xgboost or MLflow import here)."""

import dagster as dg
from pydantic import Field

from dgx_assets.challenger.config import ChallengerConfig
from dgx_assets.config_parts import part_of
from dgx_assets.defs.model.inputs import current_feature_input
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.metadata import number

CHALLENGER_CODE_VERSION = "1"


class ChallengerModelConfig(dg.Config, ChallengerConfig):
    """ChallengerConfig's fields (challenger/config.py), plus what only the asset decides: the registry name."""

    registered_model_name: str = Field("dgx_defect_challenger", description="MLflow registered model of the challenger")

    def challenger_config(self) -> ChallengerConfig:
        return part_of(self, ChallengerConfig)


# Trains gradient-boosted trees on every image_features batch's embeddings across the Spark executors; registers the challenger.
@dg.asset(
    deps=[dg.AssetDep("image_features", partition_mapping=dg.AllPartitionMapping())],
    group_name="model",
    kinds={"spark", "xgboost", "mlflow"},
    owners=["team:ml-platform"],
    code_version=CHALLENGER_CODE_VERSION,
    description=(
        "A challenger to trained_model: xgboost.spark.SparkXGBClassifier on image_features' pretrained embeddings, "
        "one XGBoost worker per Spark task (the GPU hist method when executors have GPUs), on trained_model's "
        "splits (train to fit, validation for early stopping, test to report). One MLflow run with the same "
        "lineage as trained_model; registered under its own name with the alias `challenger`; "
        "`<lake>/challenger_model/model_info.json` for the report."
    ),
)
def challenger_model(
    context: dg.AssetExecutionContext,
    config: ChallengerModelConfig,
    spark: SparkResource,
    lake: LakeResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    from dgx_assets.challenger.tracking import (
        train_and_track_challenger,
        write_challenger_outputs,
    )
    from dgx_assets.spark.progress import spark_progress
    from dgx_assets.tracking.store import TrackingConfigError
    from dgx_assets.training.dataset import FeatureDataError

    challenger = config.challenger_config()
    store = lake.lake
    files, partitions, features, lineage = current_feature_input(context, store, CHALLENGER_CODE_VERSION)
    tracking = mlflow.tracking_config(config.registered_model_name)
    features_table = store.tables.table("image_features")
    assert features_table is not None  # current_features found its files
    session = spark.spark_session
    try:
        with spark_progress(session, context.log.info):
            tracked = train_and_track_challenger(
                session,
                files,
                list(features.uris),
                features_table.location(),
                challenger,
                tracking,
                lineage,
                log=context.log.info,
            )
    except (TrackingConfigError, FeatureDataError) as error:
        raise dg.Failure(str(error)) from error
    folder = write_challenger_outputs(store, tracked, tracking.tracking_uri)
    result, metrics = tracked.result, tracked.result.test.metrics
    return dg.MaterializeResult(
        metadata={
            **({"mlflow_run": dg.MetadataValue.url(tracked.run_url)} if tracked.run_url else {}),
            "mlflow_run_id": tracked.run_id,
            "model_version": f"{tracked.model_name} v{tracked.model_version} (alias challenger)",
            "test_accuracy": number(metrics["accuracy"]),
            "test_accuracy_ci95": f"{metrics['accuracy_ci95_low']:.3f}..{metrics['accuracy_ci95_high']:.3f}",
            "test_macro_f1": number(metrics["macro_f1"]),
            "test_images": int(metrics["images"]),
            "inference_ms_per_image": number(result.inference_ms_per_image),
            "training_seconds": round(result.training_seconds, 1),
            "workers": f"{result.num_workers} on {result.device}",
            "best_iteration": result.best_iteration if result.best_iteration is not None else -1,
            "partitions": dg.MetadataValue.json(partitions),
            "data_digest": tracked.data_digest,
            "path": dg.MetadataValue.path(folder),
        }
    )
