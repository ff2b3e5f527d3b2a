import dagster as dg

from dgx_assets.tuning.assets import hyperparameter_search

# Resources ("spark", "lake", "mlflow") are merged at the top level in dgx_assets/definitions.py.
defs = dg.Definitions(assets=[hyperparameter_search])
