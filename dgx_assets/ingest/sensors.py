import json

import dagster as dg

from dgx_assets.partitions import image_batches
from dgx_assets.resources import LakeResource

# raw_images and the per-batch assets that follow it; the whole-dataset assets from trained_model on are
# left to the retraining job, which learns from every batch at once.
ingest_batch_job = dg.define_asset_job(
    "ingest_batch",
    selection=dg.AssetSelection.assets("raw_images").downstream() - dg.AssetSelection.assets("trained_model").downstream(),
    partitions_def=image_batches,
    description="Ingest one landing batch: raw_images and the per-batch features after it.",
)


def _load_cursor(raw: str | None) -> dict:
    cursor = json.loads(raw) if raw else {}
    return {"requested": cursor.get("requested", {}), "seen": cursor.get("seen", {})}


# Watches the landing zone (file://, hdfs://, webhdfs://) for batch folders that are new or changed and done copying.
@dg.sensor(
    job=ingest_batch_job,
    minimum_interval_seconds=30,
    description=(
        "Lists DGX_LANDING_URI each tick; a batch folder that is new or changed, holds no file still being copied and "
        "looks the same as on the previous tick gets a dynamic partition and one ingest run."
    ),
)
def landing_zone_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
    # cursor: {"requested": {batch: fingerprint ingested}, "seen": {batch: fingerprint on the last tick}}
    from dgx_assets.ingest.landing import scan_landing

    cursor = _load_cursor(context.cursor)
    batches = scan_landing(lake.landing_uri)
    ready, waiting = [], []
    seen = {}
    for name, state in batches.items():
        if cursor["requested"].get(name) == state.fingerprint:
            continue
        seen[name] = state.fingerprint
        if not state.complete:
            waiting.append(f"{name}: {len(state.in_progress)} file(s) still being copied" if state.in_progress else f"{name}: empty")
        elif cursor["seen"].get(name) != state.fingerprint:
            waiting.append(f"{name}: changed since the last look, waiting for it to settle")
        else:
            ready.append(state)

    for state in ready:
        cursor["requested"][state.name] = state.fingerprint
        seen.pop(state.name)
    cursor["seen"] = seen
    new_keys = [s.name for s in ready if not context.instance.has_dynamic_partition(image_batches.name, s.name)]
    if waiting:
        context.log.info("Not ready yet: " + "; ".join(waiting))
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=f"{state.name}:{state.fingerprint}",
                partition_key=state.name,
                tags={"dgx/landing_fingerprint": state.fingerprint, "dgx/files": str(state.files)},
            )
            for state in ready
        ],
        dynamic_partitions_requests=[image_batches.build_add_request(new_keys)] if new_keys else [],
        cursor=json.dumps(cursor, sort_keys=True),
        skip_reason=None if ready else ("; ".join(waiting) or "no new or changed batch"),
    )
