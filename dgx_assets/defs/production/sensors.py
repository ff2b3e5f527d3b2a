"""Retraining when it matters: inspectors' labels have landed, or a batch drifted and new labels exist since the
champion's model was trained. The nightly schedule stays; this adds the runs that should not wait for it."""

import datetime as dt
import json

import dagster as dg

from dgx_assets import settings
from dgx_assets.defs.ingest.assets import LABELLED_IMAGES
from dgx_assets.defs.model.schedules import retrain_job
from dgx_assets.labels.importer import is_label_batch
from dgx_assets.partitions import latest_check_evaluations
from dgx_assets.production.drift import DRIFT_CHECK

DRIFT_KEY = dg.AssetCheckKey(dg.AssetKey("defect_predictions"), DRIFT_CHECK)


def _last_trained(instance: dg.DagsterInstance) -> float:
    """When trained_model was last materialized (0: never): labels older than that are in the model already."""
    latest = instance.get_latest_materialization_event(dg.AssetKey("trained_model"))
    return latest.timestamp if latest is not None else 0.0


def _labelled_batches_since(instance: dg.DagsterInstance, since: float) -> list[str]:
    """raw_images batches materialized after `since` that brought labelled images (not only production ones)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_images"), after_timestamp=since), limit=500
    ).records
    batches = set()
    for record in records:
        materialization = record.asset_materialization
        labelled = materialization.metadata.get(LABELLED_IMAGES) if materialization is not None else None
        if materialization is not None and materialization.partition and labelled is not None and labelled.value:
            batches.add(materialization.partition)
    return sorted(batches)


def _drifted_since(instance: dg.DagsterInstance, since: float) -> list[str]:
    """Batches whose latest embedding_drift result, made after `since`, failed."""
    latest = latest_check_evaluations(instance, DRIFT_KEY)
    return sorted(batch for batch, (evaluation, at) in latest.items() if batch and at >= since and not evaluation.passed)


# Requests the retraining job when imported labels landed, or drift was flagged and new labels exist; rate-limited.
@dg.sensor(
    job=retrain_job,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Requests retrain_model when a batch of inspectors' labels (dgx-assets import-labels) has been ingested since "
        "trained_model last ran, or when embedding_drift flagged a batch and labelled images have landed since; at "
        "most once per DGX_RETRAIN_MIN_INTERVAL_S (6 h by default). Off until turned on, like the schedule."
    ),
)
def retrain_on_new_labels(context: dg.SensorEvaluationContext):
    cursor = json.loads(context.cursor) if context.cursor else {}
    now = dt.datetime.now(dt.UTC).timestamp()
    interval = settings.environment().retrain_min_interval_s
    if now - cursor.get("requested_at", 0.0) < interval:
        return dg.SkipReason(f"a retraining was requested less than {interval:.0f} s ago (DGX_RETRAIN_MIN_INTERVAL_S)")
    trained = _last_trained(context.instance)
    labelled = _labelled_batches_since(context.instance, trained)
    imported = [batch for batch in labelled if is_label_batch(batch)]
    drifted = _drifted_since(context.instance, trained)
    if imported:
        reason = f"inspectors' labels landed: {', '.join(imported)}"
    elif drifted and labelled:
        reason = f"drift on {', '.join(drifted)} and new labelled batches: {', '.join(labelled)}"
    else:
        return dg.SkipReason(
            "no imported labels since trained_model last ran"
            + (f"; drift on {', '.join(drifted)}, but no new labelled images" if drifted else "")
        )
    context.log.info(f"requesting retrain_model: {reason}")
    context.update_cursor(json.dumps({"requested_at": now}))
    return dg.RunRequest(
        run_key=f"new-labels-{now:.0f}",
        tags={"dgx/trigger": "new-labels" if imported else "drift", "dgx/reason": reason[:200]},
    )
