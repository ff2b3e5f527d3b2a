"""ernie_generated_images: synthetic inspection images from the prompts table, made by ERNIE-Image.

Thin Dagster layer over `generate.py` (the Spark job) and `resources.py` (the endpoints). Nothing here
imports paddle or pyspark at module level.
"""

import contextlib
from typing import Optional

import dagster as dg

from dgx_assets import metadata as ui
from dgx_assets.generation import generate, table
from dgx_assets.generation.resources import ErnieServingResource
from dgx_assets.resources import LakeResource
from dgx_assets.spark.parquet import image_table_options
from dgx_assets.spark.progress import spark_progress
from dgx_assets.spark.resource import SparkResource

ASSET_KEY = "ernie_generated_images"
ASSET_OWNERS = ["team:generative-inspection"]
PREVIEW_COLUMNS = ["id", "status", "truncated", "attempts", "endpoint", "latency_s", "file_name", "error"]
# What the main columns mean, for the column schema the UI shows (others are listed with their type only).
COLUMN_DESCRIPTIONS = {
    "id": "the prompt's id (row-<hash of its request> when the prompts table gives none)",
    "prompt": "the text sent to ERNIE-Image",
    "label": "the class the image is meant to show",
    "status": "valid, corrupted, decode_error, failed, bad_reply, rejected or invalid_prompt",
    "error": "why, when status is not valid",
    "endpoint": "the serving endpoint that answered",
    "file_name": "the PNG under png/",
    "content": "the PNG bytes (valid rows)",
}


class ErnieGenerationConfig(dg.Config):
    redo_all: bool = False  # regenerate every prompt, not only the missing or failed ones
    max_attempts: int = 3  # generations per prompt before its row keeps a bad status
    default_width: int = 512
    default_height: int = 512
    prompts_uri: Optional[str] = None  # None: the lake resource's prompts (DGX_PROMPTS_URI)


# Generates an image for every prompt in DGX_PROMPTS_URI on Spark executors through the ERNIE-Image endpoints.
@dg.asset(
    key=ASSET_KEY,
    group_name="generation",
    kinds={"spark", "paddle"},
    owners=ASSET_OWNERS,
    code_version="1",
    description=(
        "Synthetic defect images from ERNIE-Image: Spark executors call the serving endpoints (Paddle Serving "
        "pipeline or OpenAI-compatible), decode and classify every image (valid / corrupted / decode_error), "
        "regenerate bad ones, and write Parquet (one row per prompt, with status, error, endpoint, latency, "
        "attempts) plus PNG files under png/. Re-materializing regenerates only missing or failed prompts "
        "unless `redo_all`."
    ),
)
def ernie_generated_images(
    context: dg.AssetExecutionContext,
    config: ErnieGenerationConfig,
    spark: SparkResource,
    lake: LakeResource,
    ernie: ErnieServingResource,
) -> dg.MaterializeResult:
    from dgx_assets.generation.prompts import read_prompts

    session = spark.spark_session
    store = lake.lake
    prompts_uri = config.prompts_uri or lake.prompts_uri
    final, staging = store.asset_uri(ASSET_KEY), store.staging_uri(ASSET_KEY)
    try:
        prompts = read_prompts(session, prompts_uri)
        prompt_count = prompts.count()
    except ValueError as error:
        raise dg.Failure(str(error)) from error
    except Exception as error:  # Spark's AnalysisException for a missing path, and kin
        raise dg.Failure(
            f"Could not read the prompts table {prompts_uri}: {str(error).splitlines()[0]}. "
            "Set DGX_PROMPTS_URI or run `dgx-assets seed-demo`."
        ) from error
    if prompt_count == 0:
        raise dg.Failure(f"The prompts table {prompts_uri} has no rows.")

    previous = None
    if not config.redo_all and table.table_files(store, final):
        previous = generate.spark_table(session, store, final)

    todo, kept = generate.split_work(prompts, previous)
    pending = todo.count()
    context.log.info(
        f"{pending} of {prompt_count} prompts to generate from {prompts_uri}; "
        f"{prompt_count - pending} kept from the previous version"
    )
    # No server is launched (or called) when every prompt already has its image.
    serving = ernie.serving(context.log) if pending else contextlib.nullcontext(())
    with serving as urls:
        job = generate.GenerationJob(
            ernie.client_settings(urls) if urls else None,
            lake_root=store.root,
            png_uri=f"{staging}/png",
            png_final_uri=f"{final}/png",
            max_attempts=config.max_attempts,
            default_width=config.default_width,
            default_height=config.default_height,
            tasks=ernie.task_count(urls),
        )
        frame = generate.generated_frame(todo if pending else None, kept, job)
        try:
            with spark_progress(session, context.log.info):
                frame.write.mode("overwrite").options(**image_table_options("content")).parquet(staging)
        except BaseException:
            # Nothing half-written stays behind; the previous version is untouched. PNGs that executors still
            # write after this are swept by the next commit (the staging folder is no longer this run's).
            store.drop_staging(staging)
            raise

    store.commit(staging, final)
    written = table.written_dataset(store, final)
    summary = table.summarize(written)
    reused = prompt_count - pending
    metadata = {
        "dagster/row_count": summary["prompts"],
        ui.COLUMN_SCHEMA: ui.column_schema(written.schema, COLUMN_DESCRIPTIONS),
        "status_counts": dg.MetadataValue.json(summary["status_counts"]),
        "valid_share": round(summary["valid_share"], 4),
        "invalid_prompts": summary["invalid_prompts"],
        "truncated_prompts": summary["truncated"],
        "reused_from_previous": reused,
        "rows_per_endpoint": dg.MetadataValue.json(summary["endpoints"]),
        "protocol": ernie.protocol,
        "endpoints": ", ".join(urls) if urls else "none needed: every image was kept",
        "prompts_uri": dg.MetadataValue.path(prompts_uri),
        "path": dg.MetadataValue.path(final),
        "png_folder": dg.MetadataValue.path(f"{final}/png"),
        "preview": dg.MetadataValue.md(written.head(10, columns=PREVIEW_COLUMNS).to_pandas().to_markdown(index=False)),
    }
    context.log.info(f"ernie_generated_images: {summary['status_counts']} ({reused} reused)")
    if summary["sent"] == 0:
        raise dg.Failure(
            description=(
                f"Every one of the {summary['prompts']} prompts in {prompts_uri} is invalid (first problems: "
                f"{' | '.join(table.first_errors(written))}): fix the prompts table and re-materialize."
            ),
            metadata=metadata,
        )
    if summary["valid"] == 0:
        errors = table.first_errors(written)
        raise dg.Failure(
            description=(
                f"No image could be generated for any of the {summary['prompts']} prompts "
                f"(statuses {summary['status_counts']}). First errors: {' | '.join(errors)}. "
                "Check that the ERNIE-Image endpoints (DGX_ERNIE_ENDPOINTS) are up and answer /status; "
                f"every prompt's row with its reason is in {final}."
            ),
            metadata=metadata,
        )
    return dg.MaterializeResult(metadata=metadata)
