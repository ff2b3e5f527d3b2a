"""ERNIE-Image generation: the asset and its checks (resources are merged at the top level: spark, lake, ernie)."""

import dagster as dg

from dgx_assets.generation.assets import ernie_generated_images
from dgx_assets.generation.checks import generation_checks

defs = dg.Definitions(assets=[ernie_generated_images], asset_checks=generation_checks)
