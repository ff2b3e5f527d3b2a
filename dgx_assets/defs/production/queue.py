"""review_queue: the production images of a batch the champion is least sure of, as a Label Studio project's files
with a Grad-CAM picture each. The files are dgx_assets/production/review.py's, the pictures saliency.py's."""

import dagster as dg
from pydantic import Field

from dgx_assets import metadata, settings
from dgx_assets.defs.production.predictions import PRODUCTION_OWNERS, defect_predictions
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.partitions import BatchResult, batch_backfill_policy, image_batches, materialize_batches


class ReviewQueueConfig(dg.Config):
    size: int = Field(20, ge=1, le=1000, description="How many images go to people: those nearest the threshold")


# Queues the batch's least certain production images for inspectors, each with where the model looked.
@dg.asset(
    partitions_def=image_batches,
    deps=[defect_predictions],
    group_name="production",
    kinds={"tensorflow", "mlflow"},
    owners=PRODUCTION_OWNERS,
    code_version="1",
    backfill_policy=batch_backfill_policy,
    description=(
        "The `size` production images (no label yet) whose P(defective) is nearest the champion's threshold, as a "
        "Label Studio task list (`tasks.json`, its JSON import format, least sure first) and labelling config under "
        "`<lake>/review_queue/`, with each image and its Grad-CAM picture served read-only by `dgx-assets docs-server`. "
        "Label them, export, and `dgx-assets import-labels EXPORT --batch NAME` lands them as a labelled batch."
    ),
)
def review_queue(
    context: dg.AssetExecutionContext, config: ReviewQueueConfig, lake: LakeResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    from dgx_assets.production.scoring import download_model, registered_version
    from dgx_assets.training.model import model_from_bytes

    tracking_uri = mlflow.tracking_config().tracking_uri
    loaded: dict = {}

    def model_of(name: str, version: str):
        """The scoring version's Keras model, loaded once per run (a backfill's batches share it)."""
        if (name, version) not in loaded:
            champion = registered_version(tracking_uri, name, version)
            loaded[(name, version)] = champion, model_from_bytes(download_model(tracking_uri, champion), compile=False)
        return loaded[(name, version)]

    return materialize_batches(
        context,
        lambda batch: _queue_batch(context, batch, config.size, lake, model_of),
        lambda batch, result: {"tasks": result.metadata["tasks"]},
    )


def _queue_batch(context, batch: str, size: int, lake: LakeResource, model_of) -> BatchResult:
    from pyiceberg.expressions import And, EqualTo, IsNull

    from dgx_assets.lake.files import PARTITION_COLUMN
    from dgx_assets.production import review
    from dgx_assets.production.saliency import grad_cams, overlay_png
    from dgx_assets.production.scoring import PREDICTIONS_TABLE

    store = lake.lake
    rows = store.tables.scan(
        PREDICTIONS_TABLE,
        ["sha256", "path", "defect_probability", "threshold", "model_name", "model_version"],
        And(EqualTo(PARTITION_COLUMN, batch), IsNull("label")),  # pyright: ignore[reportCallIssue]
    )
    scored = rows.to_pylist() if rows is not None else []
    docs_url = settings.environment().docs_url
    if not scored:
        context.log.info(f"review_queue[{batch}]: no production images (every image came with a label)")
        return BatchResult(metadata={"tasks": 0})
    name, version = scored[0]["model_name"], scored[0]["model_version"]
    champion, model = model_of(name, version)
    threshold = scored[0]["threshold"] if scored[0]["threshold"] is not None else 0.5
    queued = review.least_certain(scored, threshold, size)
    pixels = _model_inputs(store, batch, [row["sha256"] for row in queued])
    positive = champion.positive if champion.positive is not None else 0
    heatmaps = grad_cams(model, pixels, positive)  # where the evidence for a defect is
    saliency = {row["sha256"]: overlay_png(image, heat) for row, image, heat in zip(queued, pixels, heatmaps)}
    folder = review.write_queue(
        store,
        batch,
        queued,
        champion.class_names,
        docs_url=docs_url,
        model_version=version,
        threshold=threshold,
        saliency=saliency,
    )
    tasks_url = review.queue_url(docs_url, batch, review.TASKS_FILE)
    context.log.info(f"review_queue[{batch}]: {len(queued)} of {len(scored)} production images queued -> {tasks_url}")
    return BatchResult(
        metadata={
            "tasks": len(queued),
            "production_images": len(scored),
            "label_studio_tasks": dg.MetadataValue.url(tasks_url),
            "labeling_config": dg.MetadataValue.url(review.queue_url(docs_url, batch, review.CONFIG_FILE)),
            "path": dg.MetadataValue.path(folder),
            "model_version": f"{name} v{version}",
            "queued": metadata.table(
                ["image", "P(defective)", "margin", "saliency"],
                [
                    [
                        row["path"].rsplit("/", 1)[-1],
                        f"{row['defect_probability']:.3f}",
                        f"{review.margin(row['defect_probability'], threshold):.3f}",
                        f"[picture]({review.queue_url(docs_url, batch, *review.saliency_file(row['sha256']))})",
                    ]
                    for row in queued
                ],
            ),
            "import_labels": dg.MetadataValue.md(f"`{review.import_command(batch)}`"),
        }
    )


def _model_inputs(store, batch: str, sha256s: list[str]):
    """float32 model inputs of these images, from image_features' tensors (what the champion scored)."""
    import numpy as np
    from pyiceberg.expressions import And, EqualTo, In

    from dgx_assets.lake.files import PARTITION_COLUMN
    from dgx_assets.training.features import tensor_from_row

    rows = store.tables.scan(
        "image_features",
        ["sha256", "tensor", "tensor_shape"],
        And(EqualTo(PARTITION_COLUMN, batch), In("sha256", sha256s)),  # pyright: ignore[reportCallIssue]
    ).to_pylist()
    tensors = {row["sha256"]: tensor_from_row(row["tensor"], row["tensor_shape"]) for row in rows if row["tensor"]}
    return np.stack([tensors[sha] for sha in sha256s]).astype(np.float32)
