"""defect_predictions: each batch's images scored by the registry's `champion` version, as an Iceberg table.

Thin on purpose: the work is in dgx_assets/production/scoring.py. No TensorFlow or PySpark import at module level.
"""

import dagster as dg

from dgx_assets import links, metadata
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.partitions import BatchResult, batch_backfill_policy, image_batches, materialize_batches

PRODUCTION_OWNERS = ["team:ml-platform"]
NO_CHAMPION = "no champion yet: run champion_model"


# Scores every valid image of a batch with the version behind the alias `champion`, on Spark executors.
@dg.asset(
    partitions_def=image_batches,
    deps=["image_features", "champion_model"],
    group_name="production",
    kinds={"spark", "tensorflow", "mlflow", "iceberg"},
    owners=PRODUCTION_OWNERS,
    code_version="1",
    backfill_policy=batch_backfill_policy,
    output_required=False,  # no champion yet: nothing is scored, nothing is written
    description=(
        "Every valid image of the batch (production images without a label, and labelled ones) scored by the MLflow "
        "model version behind the alias `champion` at run time, on Spark executors, from image_features' tensors and "
        "with the decision threshold the version was trained with. Iceberg table `dgx.defect_predictions`, one row "
        "per image, each batch's partition replaced in one transaction. Without a champion it writes nothing."
    ),
)
def defect_predictions(context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource, mlflow: MlflowResource):
    from dgx_assets.production.scoring import download_model, find_champion

    tracking = mlflow.tracking_config()
    champion = find_champion(tracking.tracking_uri, tracking.registered_model_name)
    if champion is None:
        context.log.warning(NO_CHAMPION)
        return
    context.log.info(f"Scoring with {champion.model_name} v{champion.version} (alias champion, run {champion.run_id})")
    model_bytes = download_model(tracking.tracking_uri, champion)
    yield materialize_batches(
        context,
        lambda batch: _score_batch(context, batch, champion, model_bytes, spark, lake, tracking.ui_url),
        lambda batch, result: {
            "images": result.metadata["dagster/row_count"],
            "predicted_defect_rate": result.metadata["predicted_defect_rate"],
        },
    )


def _score_batch(context, batch: str, champion, model_bytes: bytes, spark, lake, ui_url: str) -> BatchResult:
    from pyiceberg.expressions import EqualTo

    from dgx_assets.lake.files import PARTITION_COLUMN
    from dgx_assets.production.figures import scored_batch
    from dgx_assets.production.scoring import PREDICTIONS_COLUMNS, PREDICTIONS_SCHEMA, PREDICTIONS_TABLE, score_batch
    from dgx_assets.spark.progress import spark_progress

    store = lake.lake
    features = store.tables.snapshot("image_features", batch=batch)
    if not features.uris:
        raise dg.Failure(f"image_features holds no rows of batch {batch!r}: materialize image_features for it first")

    def write(folder: str) -> list[str]:
        with spark_progress(spark.spark_session, context.log.info):
            files = score_batch(spark.spark_session, features, champion, model_bytes, folder, lake.table_writer)
        if not files:
            raise dg.Failure(f"image_features[{batch}] has no usable rows to score (every feature_status is error)")
        return files

    snapshot_id = store.tables.write_and_commit(PREDICTIONS_TABLE, PREDICTIONS_SCHEMA, write, batch, context.run_id)
    rows = store.tables.scan(
        PREDICTIONS_TABLE,
        ["label", "predicted_label", "defect_probability"],
        EqualTo(PARTITION_COLUMN, batch),  # pyright: ignore[reportCallIssue]
        snapshot_id,
    )
    positive = champion.positive_class
    figures = scored_batch(rows.to_pydict() if rows is not None else {}, positive)
    rate = figures.predicted_defect_rate
    context.log.info(
        f"defect_predictions[{batch}]: {figures.images} images scored by v{champion.version}"
        + (f", {rate:.1%} predicted {positive}" if rate is not None else "")
    )
    return BatchResult(
        metadata={
            "dagster/row_count": figures.images,
            "production_images": figures.production_images,
            "predicted_defect_rate": metadata.number(rate),
            "model_version": f"{champion.model_name} v{champion.version}",
            **(
                {
                    "mlflow_model_version": dg.MetadataValue.url(
                        links.mlflow_model_version(ui_url, champion.model_name, champion.version)
                    )
                }
                if ui_url
                else {}
            ),
            "threshold": metadata.number(champion.decision.threshold),
            "defect_probability_histogram": metadata.table(
                [f"P({positive or 'positive'})", "images"], [[f"{low:.1f}–{high:.1f}", n] for low, high, n in figures.histogram]
            ),
            **(
                {"labelled_images": figures.labelled_images, "labelled_accuracy": metadata.number(figures.labelled_accuracy)}
                if figures.labelled_images
                else {}
            ),
            metadata.COLUMN_SCHEMA: metadata.column_schema(PREDICTIONS_SCHEMA, PREDICTIONS_COLUMNS),
            **metadata.table_snapshot(store, PREDICTIONS_TABLE, snapshot_id),
            "image_features_snapshot_id": str(features.snapshot_id),
        },
        data_version=dg.DataVersion(f"v{champion.version} features {features.snapshot_id}"),
    )
