"""Addresses a browser opens: MLflow runs and model versions, Dagster runs and assets, the report and data docs.

The bases come from DGX_MLFLOW_UI_URL, DGX_DAGSTER_UI_URL and DGX_DOCS_URL (settings.py); a `sqlite:` tracking
URI, a `models:/` URI or a `file://` path is no place a browser goes from an http page.
"""

from __future__ import annotations

from urllib.parse import quote

# MLflow 3.17's UI takes its GenAI or model-training view from this parameter (then from the view last chosen,
# GenAI by default), not from the experiment's `mlflow.experimentKind` tag: every link asks for the training view.
TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_runs(ui_url: str, experiment_id: str) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def mlflow_run(ui_url: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def mlflow_model_version(ui_url: str, model_name: str, version: str) -> str:
    return f"{ui_url.rstrip('/')}/#/models/{quote(model_name)}/versions/{version}?{TRAINING_VIEW}"


# The docs server's folders (reporting/docs_server.py), and the report's page in the first. The review queue's
# route is also its folder in the lake (<lake>/review_queue/, production/review.py).
REPORT_ROUTE, DATA_DOCS_ROUTE, REVIEW_QUEUE_ROUTE = "quality_report", "data-docs", "review_queue"
REPORT_PAGE = "report.html"


def docs_page(docs_url: str, route: str, *parts: str) -> str:
    """A page of the read-only docs server (reporting/docs_server.py): the report, GE's data docs, a review queue's
    files; each part percent-encoded."""
    return "/".join([docs_url.rstrip("/"), route, *(quote(part) for part in parts)])


def dagster_run(ui_url: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/runs/{run_id}"


def dagster_asset(ui_url: str, asset_key: str) -> str:
    return f"{ui_url.rstrip('/')}/assets/{'/'.join(quote(part) for part in asset_key.split('/'))}"
