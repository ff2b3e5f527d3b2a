"""hyperparameter_search: the Dagster layer over tuning/tracking.py (no ray, pyspark or MLflow import here)."""

import dagster as dg

from dgx_assets.config_parts import part_of
from dgx_assets.defs.model.inputs import current_feature_input
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.tuning.config import SearchConfig, SearchConfigError

# Assets with this tag are left out of `make demo` (they need an extra or take long); materialize them by hand.
OPTIONAL_TAG = {"dgx/optional": "true"}
SEARCH_CODE_VERSION = "1"


class HyperparameterSearchConfig(dg.Config, SearchConfig):
    """The launchpad's fields are SearchConfig's (tuning/config.py); the asset adds none of its own."""

    def search_config(self) -> SearchConfig:
        return part_of(self, SearchConfig)


# Searches trained_model's head recipe with Ray Tune on a Ray cluster living on the run's Spark executors; writes the best.
@dg.asset(
    deps=[dg.AssetDep("image_features", partition_mapping=dg.AllPartitionMapping())],
    group_name="model",
    kinds={"spark", "ray", "mlflow"},
    owners=["team:ml-platform"],
    tags=OPTIONAL_TAG,
    code_version=SEARCH_CODE_VERSION,
    description=(
        "Optional (the `ray` extra): starts a Ray cluster on the run's Spark executors (ray.util.spark), runs Ray "
        "Tune with ASHA early stopping over the classifier head's learning rate, dropout and batch size (each trial "
        "fits the head on image_features' train embeddings, scored on the validation split), logs one nested MLflow "
        "run per trial, tears Ray down, and writes `<lake>/hyperparameter_search/best_config.json`, which "
        "trained_model uses when `use_searched_hyperparameters` is set."
    ),
)
def hyperparameter_search(
    context: dg.AssetExecutionContext,
    config: HyperparameterSearchConfig,
    spark: SparkResource,
    lake: LakeResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    search = config.search_config()
    try:
        import ray  # noqa: F401
    except ImportError as error:
        raise dg.Failure("hyperparameter_search needs Ray: pip install 'dgx_assets[ray]' (ray[tune])") from error
    from dgx_assets.tracking.store import TrackingConfigError
    from dgx_assets.training.dataset import FeatureDataError
    from dgx_assets.tuning.tracking import search_and_track

    store = lake.lake
    files, partitions, _, lineage = current_feature_input(context, store, SEARCH_CODE_VERSION)
    tracking = mlflow.tracking_config()
    try:
        tracked = search_and_track(spark.spark_session, files, store, search, tracking, lineage, log=context.log.info)
    except (SearchConfigError, TrackingConfigError, FeatureDataError) as error:
        raise dg.Failure(str(error)) from error
    outcome = tracked.outcome
    return dg.MaterializeResult(
        metadata={
            **({"mlflow_run": dg.MetadataValue.url(tracked.run_url)} if tracked.run_url else {}),
            "mlflow_run_id": tracked.run_id,
            "best_hyperparameters": dg.MetadataValue.json(outcome.best_config),
            "best_val_loss": outcome.best_metrics["val_loss"],
            "best_val_accuracy": outcome.best_metrics["val_accuracy"],
            "trials": len(outcome.trials),
            "trials_stopped_early": sum(t.stopped_early for t in outcome.trials),
            "ray_worker_nodes": outcome.ray_worker_nodes,
            "path": dg.MetadataValue.path(tracked.best_config_uri),
        }
    )
