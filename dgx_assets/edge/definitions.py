import dagster as dg

from dgx_assets.edge.assets import edge_model
from dgx_assets.edge.champion import champion_model

# Resources ("lake", "mlflow") are merged at the top level in dgx_assets/definitions.py. The `parity` check is
# edge_model's own (check_specs): it runs in edge_model's step.
defs = dg.Definitions(assets=[edge_model, champion_model])
