import dagster as dg

from dgx_assets.ingest.assets import raw_images
from dgx_assets.ingest.checks import raw_image_checks
from dgx_assets.ingest.sensors import ingest_batch_job, landing_zone_sensor

defs = dg.Definitions(
    assets=[raw_images],
    asset_checks=raw_image_checks,
    jobs=[ingest_batch_job],
    sensors=[landing_zone_sensor],
)
