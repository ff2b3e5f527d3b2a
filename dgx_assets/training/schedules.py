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


def retraining_schedule_from_env() -> dg.ScheduleDefinition:
    return build_retraining_schedule(*settings.retrain_schedule())


# Evaluates image_features' eager condition: a raw_images batch materialized by hand gets its features (the
# landing sensor's runs make them already). Off until turned on, like every automation here.
features_automation_sensor = dg.AutomationConditionSensorDefinition(
    "image_features_automation",
    target=dg.AssetSelection.assets("image_features"),
    default_status=dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=60,
    description="Materializes image_features partitions whose raw_images partition is new or was updated.",
)
