"""image_features: model-ready tensors, image statistics and pretrained embeddings of one batch, on Spark executors.

Thin on purpose: the work is in dgx_assets/training/features.py. No TensorFlow or PySpark import at module level.
"""

import dagster as dg
from pydantic import Field

from dgx_assets import metadata
from dgx_assets.config_parts import part_of
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.partitions import BatchResult, batch_backfill_policy, image_batches, materialize_batches
from dgx_assets.training.config import FeatureConfig

OWNER = "team:ml-platform"
FEATURES_CODE_VERSION = "1"
# What each image_features column means, for the column schema the UI shows.
IMAGE_FEATURES_COLUMNS = {
    "sha256": "content hash of the source image (its id)",
    "path": "the source file in the landing zone",
    "batch": "the landing batch the image came in (the table's partition)",
    "label": "class (null for a production image: one directly in its batch folder)",
    "split": "train / validation / test, or unlabelled for a production image (scored, never trained on)",
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
    group_name="ingest",
    kinds={"spark", "tensorflow"},
    owners=[OWNER],
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
    from dgx_assets.training.features import FEATURE_SCHEMA, build_image_features

    store = lake.lake
    raw = store.tables.snapshot("raw_images", batch=batch)
    if not raw.uris:
        raise dg.Failure(f"the table raw_images holds no rows of batch {batch!r}: materialize raw_images for it first")
    feature_config = config.feature_config()

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
        "labels": dict(sorted(Counter(ok["label"].dropna()).items())),
        "splits": dict(sorted(Counter(ok["split"]).items())),
        "statistics": {
            name: {"mean": round(float(ok[name].mean()), 5), "std": round(float(ok[name].std()), 5)}
            for name in ("brightness", "contrast", "sharpness")
        }
        if len(ok)
        else {},
    }
