"""Retraining on a schedule, and the automation that keeps image_features fresh after new raw_images batches."""

import dagster as dg

from dgx_assets import settings
from dgx_assets.settings import DEFAULT_RETRAIN_CRON

retrain_job = dg.define_asset_job(
    "retrain_model",
    selection=dg.AssetSelection.assets("trained_model").downstream(),
    description="Retrains trained_model on all image_features batches and rebuilds what depends on it.",
    tags={"dgx/queue": "gpu-training"},
)


def build_retraining_schedule(cron_schedule: str = DEFAULT_RETRAIN_CRON, timezone: str = "UTC") -> dg.ScheduleDefinition:
    # Retrains nightly (DGX_RETRAIN_CRON / DGX_RETRAIN_TIMEZONE change when): one run per scheduled tick.
    # Off until someone turns it on (Automation in the UI): a fresh checkout should not start GPU training by itself.
    @dg.schedule(
        name="retrain_model_schedule",
        job=retrain_job,
        cron_schedule=cron_schedule,
        execution_timezone=timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Retrains trained_model on cron '{cron_schedule}' ({timezone}).",
    )
    def retrain_model_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        tick = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=f"retrain-{tick.isoformat()}",
            tags={"dgx/trigger": "schedule", "dgx/scheduled_for": tick.isoformat()},
        )

    return retrain_model_schedule


# The cron is read when the code location loads (DGX_RETRAIN_CRON, DGX_RETRAIN_TIMEZONE), not at import.
@dg.definitions
def retraining_schedule() -> dg.Definitions:
    return dg.Definitions(jobs=[retrain_job], schedules=[build_retraining_schedule(*settings.environment().retrain_schedule)])
