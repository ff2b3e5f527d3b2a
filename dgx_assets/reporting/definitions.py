import dagster as dg

from dgx_assets.reporting.assets import quality_report, report_verdict

defs = dg.Definitions(assets=[quality_report], asset_checks=[report_verdict])
