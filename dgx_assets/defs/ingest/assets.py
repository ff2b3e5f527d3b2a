import dagster as dg

from dgx_assets import metadata
from dgx_assets.config_parts import part_of
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.ingest import images
from dgx_assets.partitions import BatchResult, batch_backfill_policy, image_batches, materialize_batches
from dgx_assets.spark.progress import spark_progress

ASSET_OWNERS = ["team:data-platform"]
# Metadata key of the landing batch's fingerprint (landing.batch_state) that a raw_images partition was made from.
LANDING_FINGERPRINT = "landing_fingerprint"
LABELLED_IMAGES = "labelled_images"  # valid images in a label folder: what retraining can learn from
# What each raw_images column means, for the column schema the UI shows.
RAW_IMAGES_COLUMNS = {
    "path": "the file's URI in the landing zone",
    "batch": "the landing batch (partition key)",
    "label": "the class, from the folder under the batch",
    "size_bytes": "file size in bytes",
    "modified_at": "the file's modification time in the landing zone when it was listed (UTC)",
    "sha256": "content hash (duplicates, split)",
    "format": "image format Pillow read (PNG, JPEG, ...)",
    "width": "pixels",
    "height": "pixels",
    "mode": "Pillow mode (L, RGB, ...)",
    "status": "`valid` or why the file was quarantined (corrupted, decode_error, too_large, symlink, ...)",
    "reason": "human-readable reason for a quarantined file",
    "split": "train / validation / test, stable from the content hash",
    "content": "the image bytes (valid rows only)",
    "ingested_at": "when this run wrote the row (UTC)",
}


class RawImagesConfig(dg.Config, images.IngestSettings):
    """The ingest settings as the launchpad shows them."""

    def ingest_settings(self) -> images.IngestSettings:
        """The plain settings the Spark job ships to its workers (no Dagster class in their pickles)."""
        return part_of(self, images.IngestSettings)


# Ingests one landing batch folder with Spark: every file gets a row, valid images keep their bytes.
@dg.asset(
    partitions_def=image_batches,
    group_name="ingest",
    kinds={"spark", "parquet"},
    owners=ASSET_OWNERS,
    code_version="1",
    backfill_policy=batch_backfill_policy,
    description=(
        "One row per file of a landing batch: decoded on Spark executors with Pillow, status `valid` or a reason "
        "class, stable train/validation/test split from the content hash, image bytes compacted into Parquet."
    ),
)
def raw_images(context: dg.AssetExecutionContext, config: RawImagesConfig, spark: SparkResource, lake: LakeResource):
    # A backfill run ingests its batches one after the other in the run's one SparkSession.
    return materialize_batches(
        context,
        lambda batch: _ingest_batch(context, batch, config, spark, lake),
        lambda batch, result: {
            "files_listed": result.metadata["files_listed"],
            "valid": result.metadata["valid"],
            LANDING_FINGERPRINT: result.metadata[LANDING_FINGERPRINT],
        },
    )


def _ingest_batch(
    context: dg.AssetExecutionContext, batch: str, config: RawImagesConfig, spark: SparkResource, lake: LakeResource
) -> BatchResult:
    from dgx_assets.ingest import landing, spark_ingest, tables  # pyarrow and pandas: only when a run needs them

    store = lake.lake
    landing_batch = f"{lake.landing_uri.rstrip('/')}/{batch}"
    # Listed once, as the sensor lists it: the fingerprint recorded below is the one the sensor compares.
    landed = landing.look_at_batch(landing_batch)
    frame = spark_ingest.build_raw_images(spark.spark_session, landing_batch, config.ingest_settings(), landed)
    if frame is None:
        raise dg.Failure(
            f"Landing batch {landing_batch} holds no image files ({', '.join(images.IMAGE_EXTENSIONS)}); "
            "check DGX_LANDING_URI and the batch folder name.",
        )
    context.log.info(f"Ingesting {landing_batch} into the table {tables.TABLE} (batch {batch})")

    def write(folder: str) -> list[str]:
        with spark_progress(spark.spark_session, context.log.info):
            return spark_ingest.write_raw_images(frame, folder, lake.table_writer)

    snapshot_id = store.tables.write_and_commit(tables.TABLE, spark_ingest.RAW_IMAGES_SCHEMA, write, batch, context.run_id)
    written = tables.read_partition_summary(store, batch, snapshot_id)
    if written is None:  # the listing had files, so the commit wrote rows: an empty snapshot is a lake fault
        raise dg.Failure(f"raw_images[{batch}]: snapshot {snapshot_id} holds none of the rows just committed")
    summary = tables.summarize(written)
    context.log.info(
        f"raw_images[{batch}]: {summary['files_listed']} files, {summary['valid']} valid, quarantined {summary['quarantined']}"
    )
    preview = written.slice(0, 10).select(["path", "label", "status", "reason", "format", "width", "height", "split"])
    return BatchResult(
        metadata={
            "dagster/row_count": summary["files_listed"],
            metadata.COLUMN_SCHEMA: metadata.column_schema(spark_ingest.RAW_IMAGES_SCHEMA, RAW_IMAGES_COLUMNS),
            "files_listed": summary["files_listed"],
            "valid": summary["valid"],
            "quarantined": metadata.counts(summary["quarantined"], "status", "files"),
            "size": metadata.human_size(summary["bytes"]),
            "label_counts": metadata.counts(summary["labels"], "label", "valid images"),
            LABELLED_IMAGES: summary["valid"] - summary["production_images"],  # what the retraining sensor looks for
            "production_images": summary["production_images"],  # valid, without a label folder: scored, never trained on
            "split_counts": metadata.counts(summary["splits"], "split", "valid images"),
            "preview": dg.MetadataValue.md(preview.to_pandas().to_markdown(index=False)),
            **metadata.table_snapshot(store, tables.TABLE, snapshot_id),
            "landing_batch": dg.MetadataValue.path(landing_batch),
            LANDING_FINGERPRINT: landed.state.fingerprint,
        },
        data_version=dg.DataVersion(landed.state.fingerprint),
    )
