"""The checks operators read after each generation run: enough valid images for the prompts that could be
sent (blocking), a prompts table without unusable rows (warning), and images that differ from each other
(warning: near-duplicates)."""

import dagster as dg
from pydantic import Field

from dgx_assets import settings
from dgx_assets.defs.generation.assets import ASSET_KEY, ernie_generated_images
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.generation import table
from dgx_assets.generation.diversity import MAX_IMAGES, MIN_MEAN_DISTANCE
from dgx_assets.metadata import gated, number, to_fix
from dgx_assets.metadata import table as markdown_table
from dgx_assets.quality.expectations import run_suite


class GeneratedShareConfig(dg.Config):
    min_valid_share: float = 0.9


def _no_table() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=False,
        description=f"The table {ASSET_KEY} has no data",
        metadata=to_fix("Materialize ernie_generated_images first."),
    )


# Blocks anything downstream (the quality report) when too few of the sent prompts produced a usable image.
@dg.asset_check(
    asset=ernie_generated_images,
    blocking=True,
    description="GE: of the prompts that could be sent (rows not `invalid_prompt`), the share whose image is "
    "`valid` is at least `min_valid_share` (blocking); counts per status in the metadata.",
)
def generated_images_valid(config: GeneratedShareConfig, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    store = lake.lake
    snapshot = store.tables.snapshot(ASSET_KEY)  # one snapshot for both reads, however the table moves meanwhile
    if not snapshot.uris:
        return _no_table()
    summary = table.summarize(snapshot.dataset())
    frame = store.tables.spark_frame(spark.spark_session, ASSET_KEY, snapshot_id=snapshot.snapshot_id).drop("content")
    sent = frame.where(frame.status != table.INVALID_PROMPT)  # invalid prompts: generated_prompts_valid
    outcome = run_suite(
        sent,
        "ernie_generated_valid_share",
        [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="status"),  # pyright: ignore[reportPrivateImportUsage]
            gx.expectations.ExpectColumnValuesToBeInSet(column="status", value_set=[table.VALID], mostly=config.min_valid_share),  # pyright: ignore[reportPrivateImportUsage]
            gx.expectations.ExpectColumnValuesToBeUnique(column="file_name"),  # pyright: ignore[reportPrivateImportUsage]
        ],
        settings.environment().state_dir / "gx",
        f"{ASSET_KEY}.generated_images_valid",
    )
    passed = summary["sent"] > 0 and outcome.success and summary["valid_share"] >= config.min_valid_share
    bad = {status: n for status, n in summary["status_counts"].items() if status not in (table.VALID, table.INVALID_PROMPT)}
    found = f"{summary['valid']} of the {summary['sent']} prompts that could be sent have a valid image" + (
        "" if passed else f" ({summary['valid_share']:.1%}, at least {config.min_valid_share:.0%} needed; not valid: {bad})"
    )
    fix = (
        ""
        if passed
        else (
            "Read `status` and `error` per row: `failed` means the endpoints were down or kept failing, `bad_reply` that "
            "they answered in a shape the protocol does not allow, `corrupted`/`decode_error` that they sent broken "
            "images, `rejected` that they refused the request (size, seed). Then re-materialize: only those rows are "
            "regenerated."
        )
    )
    return dg.AssetCheckResult(
        passed=passed,
        description=found,
        metadata={
            "status_counts": dg.MetadataValue.json(summary["status_counts"]),
            "valid_share": round(summary["valid_share"], 4),
            "min_valid_share": config.min_valid_share,
            "prompts": summary["prompts"],
            "prompts_sent": summary["sent"],
            "ge_statistics": dg.MetadataValue.json(outcome.statistics),
            **({"ge_data_docs": dg.MetadataValue.url(outcome.data_docs)} if outcome.data_docs else {}),
            **to_fix(fix),
        },
    )


# Warns when rows of the prompts table cannot be sent (empty prompt, a size or seed that is no number).
@dg.asset_check(
    asset=ernie_generated_images,
    description="Every row of the prompts table can be sent: none ends `invalid_prompt` (empty prompt, bad size or "
    "seed). A warning: the other prompts' images are judged by generated_images_valid.",
)
def generated_prompts_valid(lake: LakeResource) -> dg.AssetCheckResult:
    import pyarrow.compute as pc

    written = table.written_dataset(lake.lake)
    if written is None:
        return _no_table()
    invalid = written.to_table(columns=["id", "error"], filter=pc.field("status") == table.INVALID_PROMPT)
    examples = invalid.slice(0, 20).to_pylist()
    found = (
        f"{invalid.num_rows} row(s) of the prompts table cannot be sent and were skipped: "
        + "; ".join(f"{row['id']}: {row['error']}" for row in examples[:5])
        if invalid.num_rows
        else "every prompt could be sent"
    )
    fix = (
        "Fix them in the prompts table (DGX_PROMPTS_URI) and re-materialize: only those rows are generated."
        if invalid.num_rows
        else ""
    )
    return dg.AssetCheckResult(
        passed=not invalid.num_rows,
        severity=dg.AssetCheckSeverity.WARN,
        description=found,
        metadata={"invalid_prompts": invalid.num_rows, "examples": dg.MetadataValue.json(examples), **to_fix(fix)},
    )


class DiversityConfig(dg.Config):
    min_mean_pairwise_distance: float = Field(
        MIN_MEAN_DISTANCE,
        description="Flag the batch as near-duplicates below this mean pairwise cosine distance of the valid images' "
        "EfficientNet-Lite0 embeddings (real ELPV cells: 0.2-0.4)",
    )


def _sample_ids(dataset) -> list[str]:
    """Up to MAX_IMAGES valid images' ids, spread evenly over the table sorted by id (the same on every run)."""
    import pyarrow.compute as pc

    ids = sorted(dataset.to_table(columns=["id"], filter=pc.field("status") == table.VALID).column("id").to_pylist())
    step = max(1, -(-len(ids) // MAX_IMAGES))
    return ids[::step][:MAX_IMAGES]


# Warns when the generated images are near-duplicates of each other: decodable, but no use as varied training data.
@dg.asset_check(
    asset=ernie_generated_images,
    description="The valid images differ from each other: the mean pairwise cosine distance of their embeddings from "
    "image_features' backbone (ImageNet EfficientNet-Lite0) is at least `min_mean_pairwise_distance`; below it the "
    f"batch is flagged as near-duplicates. At most {MAX_IMAGES} images, spread over the table. A warning.",
)
def generated_images_diverse(config: DiversityConfig, lake: LakeResource) -> dg.AssetCheckResult:
    import pyarrow.compute as pc

    from dgx_assets.generation.diversity import embed, pairwise_diversity

    written = table.written_dataset(lake.lake)
    if written is None:
        return _no_table()
    ids = _sample_ids(written)
    if len(ids) < 2:
        return dg.AssetCheckResult(passed=True, description=f"{len(ids)} valid image(s): nothing to compare")
    rows = {
        row["id"]: row["content"]
        for row in written.to_table(columns=["id", "content"], filter=pc.field("id").isin(ids)).to_pylist()
    }
    diversity = pairwise_diversity(ids, embed([rows[i] for i in ids]))
    near = diversity.near_duplicates(config.min_mean_pairwise_distance)
    found = (
        f"mean pairwise distance {diversity.mean_distance:.3f} of {diversity.images} valid images' EfficientNet-Lite0 "
        f"embeddings (at least {config.min_mean_pairwise_distance:g})"
    )
    if near:
        found = (
            f"The generated images are near-duplicates: {found}; the closest pair {diversity.closest[0][0]} and "
            f"{diversity.closest[0][1]} ({diversity.closest[0][2]:.3f})"
        )
    fix = (
        "The generator ignores its prompts (mode collapse): train it longer or on more varied images "
        "(`dgx-assets build-generator`), or point DGX_ERNIE_ENDPOINTS at a real ERNIE-Image server, then "
        "re-materialize with `redo_all: true`"
        if near
        else ""
    )
    return dg.AssetCheckResult(
        passed=not near,
        severity=dg.AssetCheckSeverity.WARN,
        description=found if near else f"the images differ: {found}",
        metadata={
            **gated("mean_pairwise_distance", diversity.mean_distance, config.min_mean_pairwise_distance, "min"),
            "images_compared": diversity.images,
            "closest_pairs": markdown_table(["image", "image", "distance"], [[a, b, number(d)] for a, b, d in diversity.closest]),
            **to_fix(fix),
        },
    )


generation_checks = [generated_images_valid, generated_prompts_valid, generated_images_diverse]
