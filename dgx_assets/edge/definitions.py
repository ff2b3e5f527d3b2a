import dagster as dg

from dgx_assets.edge.assets import edge_model
from dgx_assets.edge.champion import champion_model
from dgx_assets.edge.checks import edge_model_parity

# Resources ("lake", "mlflow") are merged at the top level in dgx_assets/definitions.py.
defs = dg.Definitions(assets=[edge_model, champion_model], asset_checks=[edge_model_parity])
