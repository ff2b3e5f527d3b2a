"""ERNIE-Image generation: the asset and its check (resources are merged at the top level: spark, lake, ernie)."""

import dagster as dg

from dgx_assets.generation.assets import ernie_generated_images
from dgx_assets.generation.checks import generated_images_valid

defs = dg.Definitions(assets=[ernie_generated_images], asset_checks=[generated_images_valid])
