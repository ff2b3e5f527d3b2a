"""Great Expectations suites on each raw_images partition, as Dagster asset checks.

Each check reads the partition just written with Spark and runs one small GE suite on it; the GE
statistics and failing examples go into the check's metadata, and GE's data docs stay under `.dgx/gx/`.
"""

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from dgx_assets import settings
from dgx_assets.defs.ingest.assets import raw_images
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.ingest import images
from dgx_assets.metadata import to_fix
from dgx_assets.partitions import check_each_batch, image_batches
from dgx_assets.quality.expectations import SuiteOutcome, run_suite


class ValidShareConfig(dg.Config):
    min_valid_share: float = 0.8


class ImageBoundsConfig(dg.Config):
    min_side: int = 16
    max_side: int = 8192
    formats: list[str] = sorted(images.SUPPORTED_FORMATS)


class LabelsConfig(dg.Config):
    expected_labels: list[str] = ["defective", "functional"]


# Which rows of a batch a suite judges (a Spark SQL condition); None: every file listed.
VALID_ROWS = f"status = '{images.VALID}'"
LABELLED_ROWS = "label IS NOT NULL"  # files in a label folder; production images have none


def _partition_frame(spark: SparkResource, lake: LakeResource, batch: str, rows: str | None = None):
    frame = lake.lake.tables.spark_frame(spark.spark_session, "raw_images", batch).drop("content")
    return frame.filter(rows) if rows else frame


def _result(
    outcome: SuiteOutcome,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dg.AssetCheckResult:
    failing = {e["column"] or e["expectation"]: e["failing_examples"] for e in outcome.expectations if not e["success"]}
    return dg.AssetCheckResult(
        passed=outcome.success,
        severity=severity,
        description=description,
        metadata={
            "ge_statistics": dg.MetadataValue.json(outcome.statistics),
            "ge_results": dg.MetadataValue.json(outcome.expectations),
            "failing_examples": dg.MetadataValue.json(failing),
            **({"ge_data_docs": dg.MetadataValue.url(outcome.data_docs)} if outcome.data_docs else {}),
            **(extra or {}),
        },
    )


# Partitioned asset checks are marked preview in dagster 1.13; they are what per-batch checks need.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning)


def _batch_suite(
    context: dg.AssetCheckExecutionContext,
    batch: str,
    spark: SparkResource,
    lake: LakeResource,
    suite: str,
    expectations: list,
    rows: str | None = None,
) -> SuiteOutcome:
    """One GE suite over one raw_images batch, named in the data docs by asset, check and batch (GE says
    `__none__` otherwise)."""
    frame = _partition_frame(spark, lake, batch, rows)
    run_name = f"{raw_images.key.to_user_string()}.{context.check_specs[0].name}[{batch}]"
    return run_suite(frame, suite, expectations, settings.environment().state_dir / "gx", run_name)


def _warn_each_batch(
    context: dg.AssetCheckExecutionContext,
    spark: SparkResource,
    lake: LakeResource,
    suite: str,
    expectations: Callable[[], list],
    rows: str | None = None,
) -> dg.AssetCheckResult:
    """A warning suite over each batch of the run; `expectations()` builds fresh ones for each batch's suite (a GE
    expectation belongs to one suite)."""
    return check_each_batch(
        context,
        lambda batch: _result(
            _batch_suite(context, batch, spark, lake, suite, expectations(), rows),
            severity=dg.AssetCheckSeverity.WARN,
        ),
    )


# Blocks everything downstream when too few files of a batch are usable images.
@dg.asset_check(
    asset=raw_images,
    partitions_def=image_batches,
    blocking=True,
    description="GE: the share of rows with status `valid` is at least `min_valid_share` (blocking).",
)
def valid_image_share(context: dg.AssetCheckExecutionContext, config: ValidShareConfig, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    def evaluate(batch: str) -> dg.AssetCheckResult:
        outcome = _batch_suite(
            context,
            batch,
            spark,
            lake,
            "raw_images_valid_share",
            [
                gx.expectations.ExpectColumnValuesToBeInSet(  # pyright: ignore[reportPrivateImportUsage]
                    column="status", value_set=[images.VALID], mostly=config.min_valid_share
                ),
            ],
        )
        share = 1 - (outcome.expectations[0]["unexpected_percent"] or 0) / 100
        fix = (
            ""
            if outcome.success
            else (
                "See `status`/`reason` in raw_images and the GE data docs, fix or remove the bad files (links and "
                "special files too: copy the real files in) in the landing batch, then re-materialize."
            )
        )
        return _result(
            outcome,
            description=f"{share:.1%} of batch {batch} decoded as images"
            + ("" if outcome.success else f" (at least {config.min_valid_share:.0%} needed)"),
            extra={"valid_share": round(share, 4), "min_valid_share": config.min_valid_share, **to_fix(fix)},
        )

    return check_each_batch(context, evaluate)


# Warns when valid images have sizes or formats outside what the model and cameras are expected to give.
@dg.asset_check(
    asset=raw_images,
    partitions_def=image_batches,
    description="GE: valid images have width/height within bounds and an expected format.",
)
def image_bounds(context: dg.AssetCheckExecutionContext, config: ImageBoundsConfig, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    def expectations():
        return [
            gx.expectations.ExpectColumnValuesToBeBetween(column="width", min_value=config.min_side, max_value=config.max_side),  # pyright: ignore[reportPrivateImportUsage]
            gx.expectations.ExpectColumnValuesToBeBetween(column="height", min_value=config.min_side, max_value=config.max_side),  # pyright: ignore[reportPrivateImportUsage]
            gx.expectations.ExpectColumnValuesToBeInSet(column="format", value_set=config.formats),  # pyright: ignore[reportPrivateImportUsage]
        ]

    return _warn_each_batch(context, spark, lake, "raw_images_bounds", expectations, VALID_ROWS)


# Warns when files carry a label folder the classifier does not know; production images (no label folder) pass.
@dg.asset_check(
    asset=raw_images,
    partitions_def=image_batches,
    description="GE: every label folder is one of the expected labels (files without one are production images).",
)
def labels_expected(context: dg.AssetCheckExecutionContext, config: LabelsConfig, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    def expectations():
        return [gx.expectations.ExpectColumnValuesToBeInSet(column="label", value_set=config.expected_labels)]  # pyright: ignore[reportPrivateImportUsage]

    return _warn_each_batch(context, spark, lake, "raw_images_labels", expectations, LABELLED_ROWS)


# Warns when the same image bytes arrive twice in one batch (they would be counted twice in training and evaluation).
@dg.asset_check(
    asset=raw_images,
    partitions_def=image_batches,
    description="GE: no two valid images in the batch have the same content (sha256).",
)
def no_duplicate_content(context: dg.AssetCheckExecutionContext, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    def expectations():
        return [gx.expectations.ExpectColumnValuesToBeUnique(column="sha256")]  # pyright: ignore[reportPrivateImportUsage]

    return _warn_each_batch(context, spark, lake, "raw_images_duplicates", expectations, VALID_ROWS)


raw_image_checks = [valid_image_share, image_bounds, labels_expected, no_duplicate_content]
