import json

import dagster as dg

from dgx_assets.defs.resources import LakeResource
from dgx_assets.partitions import IMAGE_BATCHES, image_batches

# raw_images and image_features of one batch, with their checks, and for a batch with production images the
# champion's scoring of it: named, not "downstream of raw_images", which also caught challenger_model and
# hyperparameter_search. Whole-dataset assets are the retraining job's.
INGEST_ASSETS = [dg.AssetKey("raw_images"), dg.AssetKey("image_features")]
SCORING_ASSETS = [dg.AssetKey("defect_predictions"), dg.AssetKey("review_queue")]
ingest_batch_job = dg.define_asset_job(
    "ingest_batch",
    selection=dg.AssetSelection.assets(*INGEST_ASSETS, *SCORING_ASSETS),
    partitions_def=image_batches,
    description=(
        "Ingest one landing batch: raw_images and the per-batch features after it; a batch with production images "
        "(files without a label folder) is also scored by the champion and its review queue written."
    ),
)


def _load_cursor(raw: str | None) -> dict:
    cursor = json.loads(raw) if raw else {}
    return {"requested": cursor.get("requested", {}), "seen": cursor.get("seen", {})}


def _ingested_fingerprint(instance: dg.DagsterInstance, batch: str) -> str | None:
    """The landing fingerprint raw_images[batch] was last materialized from (by this sensor's run, `make demo`
    or a click in the UI), or None."""
    from dgx_assets.defs.ingest.assets import LANDING_FINGERPRINT
    from dgx_assets.partitions import batch_metadata

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_images"), asset_partitions=[batch]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return batch_metadata(records[0].asset_materialization.metadata, batch, LANDING_FINGERPRINT)


# Watches the landing zone (file://, hdfs://, webhdfs://) for batch folders that are new or changed and done copying.
@dg.sensor(
    job=ingest_batch_job,
    minimum_interval_seconds=30,
    description=(
        "Lists DGX_LANDING_URI each tick; a batch folder that is new or changed, holds no file still being copied and "
        "looks the same as on the previous tick gets a dynamic partition and one ingest run, unless raw_images was "
        "already materialized from the same content; a batch holding production images (no label folder) is scored "
        "by the champion in the same run. Links, special files and unlistable folders are never followed "
        "or opened: they get a raw_images row each, and the tick says what it skipped."
    ),
)
def landing_zone_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
    # cursor: {"requested": {batch: fingerprint ingested}, "seen": {batch: fingerprint on the last tick}}
    from dgx_assets.ingest.landing import look

    cursor = _load_cursor(context.cursor)
    zone = look(lake.landing_uri)
    ready, waiting, already = [], [], []
    seen = {}
    for name, state in zone.batches.items():
        if cursor["requested"].get(name) == state.fingerprint:
            continue
        if state.complete and _ingested_fingerprint(context.instance, name) == state.fingerprint:
            cursor["requested"][name] = state.fingerprint  # ingested from this very content already
            already.append(name)
            continue
        seen[name] = state.fingerprint
        if not state.complete:
            if state.in_progress:
                waiting.append(f"{name}: {len(state.in_progress)} file(s) still being copied")
            else:
                refused = f" ({state.refused_summary(zone.root)})" if state.refused else ""
                waiting.append(f"{name}: no regular file to ingest{refused}")
        elif cursor["seen"].get(name) != state.fingerprint:
            waiting.append(f"{name}: changed since the last look, waiting for it to settle")
        else:
            ready.append(state)

    for state in ready:
        cursor["requested"][state.name] = state.fingerprint
        seen.pop(state.name)
    cursor["seen"] = seen
    new_keys = [s.name for s in ready if not context.instance.has_dynamic_partition(IMAGE_BATCHES, s.name)]
    notes = list(waiting)
    if zone.refused:
        names = ", ".join(f"{entry.path[len(zone.root) :].lstrip('/')} ({entry.status})" for entry in zone.refused)
        notes.append(f"skipped, not batch folders: {names}")
    notes += [
        f"{state.name}: requested; {state.refused_summary(zone.root)}, each recorded as a row" for state in ready if state.refused
    ]
    if already:
        notes.append(f"already ingested from the same content: {', '.join(already)}")
    if notes:
        context.log.info("; ".join(notes))
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=f"{state.name}:{state.fingerprint}",
                partition_key=state.name,
                asset_selection=INGEST_ASSETS + (SCORING_ASSETS if state.production_files else []),
                tags={
                    "dgx/landing_fingerprint": state.fingerprint,
                    "dgx/files": str(state.files),
                    **({"dgx/refused_entries": state.refused_summary(zone.root)} if state.refused else {}),
                },
            )
            for state in ready
        ],
        dynamic_partitions_requests=[image_batches.build_add_request(new_keys)] if new_keys else [],
        cursor=json.dumps(cursor, sort_keys=True),
        skip_reason=None if ready else ("; ".join(notes) or "no new or changed batch"),
    )


# Evaluates image_features' eager condition: a raw_images batch materialized by hand gets its features (the
# landing sensor's runs make them already). Off until turned on, like every automation here.
features_automation_sensor = dg.AutomationConditionSensorDefinition(
    "image_features_automation",
    target=dg.AssetSelection.assets("image_features"),
    default_status=dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=60,
    description="Materializes image_features partitions whose raw_images partition is new or was updated.",
)
