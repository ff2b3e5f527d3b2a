import dagster as dg

from dgx_assets.challenger.assets import challenger_model

# Resources ("spark", "lake", "mlflow") are merged at the top level in dgx_assets/definitions.py.
defs = dg.Definitions(assets=[challenger_model])
