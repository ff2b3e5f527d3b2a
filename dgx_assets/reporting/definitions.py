import dagster as dg

from dgx_assets.reporting.assets import quality_report

defs = dg.Definitions(assets=[quality_report])
