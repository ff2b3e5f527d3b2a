"""The check operators read after each generation run: enough valid images, and the counts per status."""

import dagster as dg

from dgx_assets import settings
from dgx_assets.generation import generate
from dgx_assets.generation.assets import ASSET_KEY, ernie_generated_images
from dgx_assets.ingest.expectations import run_suite
from dgx_assets.resources import LakeResource
from dgx_assets.spark.resource import SparkResource


class GeneratedShareConfig(dg.Config):
    min_valid_share: float = 0.9


# Blocks anything downstream (the quality report) when too few prompts produced a usable image.
@dg.asset_check(
    asset=ernie_generated_images,
    blocking=True,
    description="GE: the share of prompts whose image is `valid` is at least `min_valid_share` (blocking); "
                "counts per status in the metadata.",
)
def generated_images_valid(config: GeneratedShareConfig, spark: SparkResource, lake: LakeResource):
    import great_expectations as gx

    store = lake.lake
    final = store.asset_uri(ASSET_KEY)
    written = generate.written_dataset(store, final)
    if written is None:
        return dg.AssetCheckResult(passed=False, description=f"no table at {final}",
                                   metadata={"what_to_fix": "materialize ernie_generated_images first"})
    summary = generate.summarize(written)
    frame = generate.spark_table(spark.spark_session, store, final).drop("content")
    outcome = run_suite(
        frame,
        "ernie_generated_valid_share",
        [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="status"),
            gx.expectations.ExpectColumnValuesToBeInSet(column="status", value_set=[generate.VALID],
                                                        mostly=config.min_valid_share),
            gx.expectations.ExpectColumnValuesToBeUnique(column="file_name"),
        ],
        settings.state_dir() / "gx",
    )
    passed = outcome.success and summary["valid_share"] >= config.min_valid_share
    bad = {status: n for status, n in summary["status_counts"].items() if status != generate.VALID}
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "status_counts": dg.MetadataValue.json(summary["status_counts"]),
            "valid_share": round(summary["valid_share"], 4),
            "min_valid_share": config.min_valid_share,
            "prompts": summary["prompts"],
            "ge_statistics": dg.MetadataValue.json(outcome.statistics),
            **({"ge_data_docs": dg.MetadataValue.url(outcome.data_docs)} if outcome.data_docs else {}),
            "what_to_fix": "" if passed else (
                f"{summary['valid']} of {summary['prompts']} prompts have a valid image (not valid: {bad}). "
                "Read `status` and `error` per row: `failed` means the endpoints were down or kept failing, "
                "`corrupted`/`decode_error` that the server sent broken images, `rejected`/`invalid_prompt` "
                "that the prompts table needs fixing. Then re-materialize: only those rows are regenerated."),
        },
    )
