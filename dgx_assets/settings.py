"""Where things live by default, and the environment variables that move them (docs/architecture.md, Contracts).

Everything here is read when called, never at import time: resources call these while they initialise,
so one process can point at a test lake and the next at HDFS without reimporting anything.
"""

from __future__ import annotations

import os
from pathlib import Path

DEPLOYMENTS = ("local", "standalone", "k8s")


def repo_root() -> Path:
    """The checkout this package runs from (the parent of the `dgx_assets` package)."""
    return Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    """`<repo>/.dgx`: the local lake, the Dagster instance, MLflow's sqlite file, Spark's event log."""
    return Path(os.environ.get("DGX_STATE_DIR") or repo_root() / ".dgx")


def lake_root() -> str:
    return os.environ.get("DGX_LAKE_ROOT") or str(state_dir() / "lake")


def landing_uri(lake: str | None = None) -> str:
    return os.environ.get("DGX_LANDING_URI") or f"{(lake or lake_root()).rstrip('/')}/landing"


def prompts_uri(lake: str | None = None) -> str:
    return os.environ.get("DGX_PROMPTS_URI") or f"{(lake or lake_root()).rstrip('/')}/prompts/prompts.csv"


def deployment() -> str:
    value = os.environ.get("DGX_DEPLOYMENT", "local")
    if value not in DEPLOYMENTS:
        raise ValueError(f"DGX_DEPLOYMENT={value!r} is not one of {', '.join(DEPLOYMENTS)}")
    return value


def spark_master() -> str | None:
    return os.environ.get("DGX_SPARK_MASTER")


def mlflow_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state_dir() / 'mlflow.db'}"


def ernie_endpoints() -> str:
    return os.environ.get("DGX_ERNIE_ENDPOINTS", "local")


def git_commit() -> str | None:
    """DGX_GIT_COMMIT: the commit an image was built from when it carries no .git."""
    return os.environ.get("DGX_GIT_COMMIT") or None


def mlflow_ui_url() -> str:
    """Where a browser opens MLflow (DGX_MLFLOW_UI_URL); the default is what `make mlflow-ui` serves."""
    return (os.environ.get("DGX_MLFLOW_UI_URL") or "http://127.0.0.1:5000").rstrip("/")


def dagster_ui_url() -> str:
    """Where a browser opens the Dagster UI (DGX_DAGSTER_UI_URL); the default is what `make dev` serves."""
    return (os.environ.get("DGX_DAGSTER_UI_URL") or "http://127.0.0.1:3000").rstrip("/")
