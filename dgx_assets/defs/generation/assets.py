"""ernie_generated_images: synthetic inspection images from the prompts table, made by ERNIE-Image.

Thin Dagster layer over `generate.py` (the Spark job) and `resources.py` (the endpoints). Nothing here
imports paddle or pyspark at module level.
"""

import contextlib
from typing import Optional

import dagster as dg

from dgx_assets import metadata as ui
from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.generation import generate, table
from dgx_assets.spark.progress import spark_progress

ASSET_KEY = "ernie_generated_images"
ASSET_OWNERS = ["team:generative-inspection"]
PREVIEW_COLUMNS = ["id", "status", "truncated", "attempts", "endpoint", "latency_s", "file_name", "error"]
# What each column means, for the column schema the UI shows.
COLUMN_DESCRIPTIONS = {
    "id": "the prompt's id (row-<hash of its request> when the prompts table gives none)",
    "prompt": "the text of the prompts table's row",
    "label": "the class the image is meant to show",
    "width": "pixels asked for (the row's, else default_width)",
    "height": "pixels asked for (the row's, else default_height)",
    "seed": "the generator's seed for this prompt",
    "used_prompt": "the prompt the server says it generated from (revised or cut short), else the prompt itself",
    "truncated": "true when the server cut the prompt to what its model accepts",
    "content": "the PNG bytes (valid rows)",
    "file_name": "the PNG under png/",
    "png_path": "the PNG's full URI",
    "status": "valid, corrupted, decode_error, failed, bad_reply, rejected or invalid_prompt",
    "error": "why, when status is not valid",
    "endpoint": "the serving endpoint that answered",
    "latency_s": "seconds the answering request took",
    "attempts": "generations tried for this prompt (a bad image is regenerated up to max_attempts)",
    "http_tries": "HTTP requests sent for this prompt, retries included",
    "request_key": "hash of what decides the image (id, prompt, size, seed): a changed request is generated again",
    "generated_at": "when the image was made (UTC)",
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
    session = spark.spark_session
    store = lake.lake
    prompts_uri = config.prompts_uri or lake.prompts_uri
    png_folder = table.png_folder(store)
    prompts, prompt_count = _read_prompts(session, prompts_uri)

    previous = None
    if not config.redo_all and store.tables.snapshot(ASSET_KEY).uris:
        previous = store.tables.spark_frame(session, ASSET_KEY)

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
            png_uri=png_folder,
            max_attempts=config.max_attempts,
            default_width=config.default_width,
            default_height=config.default_height,
            tasks=ernie.task_count(urls),
        )
        frame = generate.generated_frame(todo if pending else None, kept, job)
        snapshot_id = _commit(context, frame, lake, png_folder)

    written = table.written_dataset(store, snapshot_id)
    assert written is not None  # the commit above added files
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
        **ui.table_snapshot(store, ASSET_KEY, snapshot_id),
        "png_folder": dg.MetadataValue.path(png_folder),
        "preview": dg.MetadataValue.md(written.head(10, columns=PREVIEW_COLUMNS).to_pandas().to_markdown(index=False)),
    }
    context.log.info(f"ernie_generated_images: {summary['status_counts']} ({reused} reused)")
    _fail_when_nothing_generated(summary, written, prompts_uri, snapshot_id, metadata)
    return dg.MaterializeResult(metadata=metadata)


def _read_prompts(session, prompts_uri: str):
    """The prompts table and its row count; a table that cannot be read, or is empty, fails the step with what to do."""
    from dgx_assets.generation.prompts import read_prompts

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
    return prompts, prompt_count


def _fail_when_nothing_generated(summary: dict, written, prompts_uri: str, snapshot_id: int, metadata: dict) -> None:
    """The version is committed either way (every row keeps its reason); the step fails when no prompt got an image."""
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
                f"every prompt's row with its reason is in the table {ASSET_KEY} (snapshot {snapshot_id})."
            ),
            metadata=metadata,
        )


def _commit(context: dg.AssetExecutionContext, frame, lake: LakeResource, png_folder: str) -> int:
    """Write the table's files (the PNGs are written meanwhile) and commit them as the table's new version, naming
    the run's PNG folder; on failure nothing is committed and the run's PNGs are deleted."""
    from dgx_assets.lake.tables import FILES_FOLDER
    from dgx_assets.spark.table_writer import write_table_files

    store = lake.lake

    def write(folder: str) -> list[str]:
        with spark_progress(frame.sparkSession, context.log.info):
            return write_table_files(frame, folder, table.arrow_schema(), ("content",), "zstd", lake.table_writer)

    try:
        return store.tables.write_and_commit(
            ASSET_KEY, table.arrow_schema(), write, run_id=context.run_id, properties={FILES_FOLDER: png_folder}
        )
    except BaseException:
        store.delete(png_folder)  # the previous version and its PNGs are untouched
        raise
