"""Addresses a browser opens: MLflow runs and model versions, Dagster runs and assets.

The bases come from DGX_MLFLOW_UI_URL and DGX_DAGSTER_UI_URL (settings.py); a `sqlite:` tracking URI or a
`models:/` URI is no place a browser can go.
"""

from __future__ import annotations

from urllib.parse import quote

# MLflow 3.17's UI takes its GenAI or model-training view from this parameter (then from the view last chosen,
# GenAI by default), not from the experiment's `mlflow.experimentKind` tag: run links ask for the training view.
TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_run(ui_url: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def mlflow_model_version(ui_url: str, model_name: str, version: str) -> str:
    return f"{ui_url.rstrip('/')}/#/models/{quote(model_name)}/versions/{version}"


def dagster_run(ui_url: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/runs/{run_id}"


def dagster_asset(ui_url: str, asset_key: str) -> str:
    return f"{ui_url.rstrip('/')}/assets/{'/'.join(quote(part) for part in asset_key.split('/'))}"
