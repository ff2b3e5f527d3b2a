import dagster as dg

from dgx_assets.training.assets import image_features, trained_model
from dgx_assets.training.schedules import features_automation_sensor, retrain_job, retraining_schedule_from_env

defs = dg.Definitions(
    assets=[image_features, trained_model],
    jobs=[retrain_job],
    schedules=[retraining_schedule_from_env()],
    sensors=[features_automation_sensor],
)
