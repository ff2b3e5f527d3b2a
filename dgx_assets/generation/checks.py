"""The checks operators read after each generation run: enough valid images for the prompts that could be
sent (blocking), and a prompts table without unusable rows (warning)."""

import dagster as dg

from dgx_assets import settings
from dgx_assets.generation import generate, table
from dgx_assets.generation.assets import ASSET_KEY, ernie_generated_images
from dgx_assets.quality.expectations import run_suite
from dgx_assets.resources import LakeResource
from dgx_assets.spark.resource import SparkResource


class GeneratedShareConfig(dg.Config):
    min_valid_share: float = 0.9


def _no_table(final: str) -> dg.AssetCheckResult:
    what_to_fix = f"No table at {final}: materialize ernie_generated_images first."
    return dg.AssetCheckResult(passed=False, description=what_to_fix, metadata={"what_to_fix": what_to_fix})


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
    final = store.asset_uri(ASSET_KEY)
    written = table.written_dataset(store, final)
    if written is None:
        return _no_table(final)
    summary = table.summarize(written)
    frame = generate.spark_table(spark.spark_session, store, final).drop("content")
    sent = frame.where(frame.status != table.INVALID_PROMPT)  # invalid prompts: generated_prompts_valid
    outcome = run_suite(
        sent,
        "ernie_generated_valid_share",
        [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="status"),
            gx.expectations.ExpectColumnValuesToBeInSet(column="status", value_set=[table.VALID], mostly=config.min_valid_share),
            gx.expectations.ExpectColumnValuesToBeUnique(column="file_name"),
        ],
        settings.state_dir() / "gx",
        f"{ASSET_KEY}.generated_images_valid",
    )
    passed = summary["sent"] > 0 and outcome.success and summary["valid_share"] >= config.min_valid_share
    bad = {status: n for status, n in summary["status_counts"].items() if status not in (table.VALID, table.INVALID_PROMPT)}
    what_to_fix = (
        ""
        if passed
        else (
            f"{summary['valid']} of the {summary['sent']} prompts that could be sent have a valid image "
            f"({summary['valid_share']:.1%}, at least {config.min_valid_share:.0%} needed; not valid: {bad}). "
            "Read `status` and `error` per row: `failed` means the endpoints were down or kept failing, `bad_reply` that "
            "they answered in a shape the protocol does not allow, `corrupted`/`decode_error` that they sent broken "
            "images, `rejected` that they refused the request (size, seed). Then re-materialize: only those rows are "
            "regenerated."
        )
    )
    return dg.AssetCheckResult(
        passed=passed,
        description=what_to_fix or f"{summary['valid']} of {summary['sent']} sent prompts have a valid image",
        metadata={
            "status_counts": dg.MetadataValue.json(summary["status_counts"]),
            "valid_share": round(summary["valid_share"], 4),
            "min_valid_share": config.min_valid_share,
            "prompts": summary["prompts"],
            "prompts_sent": summary["sent"],
            "ge_statistics": dg.MetadataValue.json(outcome.statistics),
            **({"ge_data_docs": dg.MetadataValue.url(outcome.data_docs)} if outcome.data_docs else {}),
            "what_to_fix": what_to_fix,
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

    store = lake.lake
    final = store.asset_uri(ASSET_KEY)
    written = table.written_dataset(store, final)
    if written is None:
        return _no_table(final)
    invalid = written.to_table(columns=["id", "error"], filter=pc.field("status") == table.INVALID_PROMPT)
    examples = invalid.slice(0, 20).to_pylist()
    what_to_fix = (
        ""
        if not invalid.num_rows
        else (
            f"{invalid.num_rows} row(s) of the prompts table cannot be sent and were skipped: "
            + "; ".join(f"{row['id']}: {row['error']}" for row in examples[:5])
            + ". Fix them in the prompts table (DGX_PROMPTS_URI) and re-materialize: only those rows are generated."
        )
    )
    return dg.AssetCheckResult(
        passed=not invalid.num_rows,
        severity=dg.AssetCheckSeverity.WARN,
        description=what_to_fix or "every prompt could be sent",
        metadata={"invalid_prompts": invalid.num_rows, "examples": dg.MetadataValue.json(examples), "what_to_fix": what_to_fix},
    )


generation_checks = [generated_images_valid, generated_prompts_valid]
