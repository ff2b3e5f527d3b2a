"""Where things live by default, and the environment variables that move them (docs/architecture.md, Contracts).

Everything here is read when called, never at import time: resources call these while they initialise,
so one process can point at a test lake and the next at HDFS without reimporting anything.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

DEPLOYMENTS = ("local", "standalone", "k8s")
DEFAULT_RETRAIN_CRON = "0 2 * * *"  # nightly, 02:00


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


def catalog_uri(lake: str | None = None) -> str:
    """DGX_CATALOG_URI: the Iceberg catalog of the lake's tables. `sqlite:///...` or `postgresql+psycopg2://...` is a
    SQL catalog, `http(s)://` a REST catalog, `thrift://` a Hive metastore. Default: a sqlite file beside a local
    lake (under the state folder by default), or under the state folder when the lake is remote (hdfs://)."""
    if value := os.environ.get("DGX_CATALOG_URI"):
        return value
    root = lake or lake_root()
    if "://" not in root or root.startswith("file:"):
        folder = Path(urlparse(root).path) if root.startswith("file:") else Path(root).expanduser().resolve()
        return f"sqlite:///{folder / 'iceberg_catalog.db'}"
    return f"sqlite:///{state_dir() / 'iceberg_catalog.db'}"


def catalog_warehouse(lake: str | None = None) -> str:
    """DGX_CATALOG_WAREHOUSE: where new tables' files go (file://, hdfs://); default `<lake>/warehouse`."""
    return os.environ.get("DGX_CATALOG_WAREHOUSE") or f"{(lake or lake_root()).rstrip('/')}/warehouse"


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


def docs_url() -> str:
    """Where a browser opens the quality report and GE's data docs (DGX_DOCS_URL): the read-only server `make dev`
    starts (`dgx-assets docs-server`)."""
    return (os.environ.get("DGX_DOCS_URL") or "http://127.0.0.1:3001").rstrip("/")


def spark_event_log() -> str:
    """DGX_SPARK_EVENT_LOG: the cluster profiles' Spark event log (what the History Server reads)."""
    return os.environ.get("DGX_SPARK_EVENT_LOG") or "file:///tmp/spark-events"


def k8s_namespace() -> str:
    return os.environ.get("DGX_K8S_NAMESPACE") or "dgx-assets"


def spark_image() -> str:
    """DGX_SPARK_IMAGE: the executor image of the `k8s` Spark profile."""
    return os.environ.get("DGX_SPARK_IMAGE") or "dgx-assets/code-location:0.1.0"


def pod_ip() -> str:
    """POD_IP (the downward API): where executors reach a driver running in a step pod."""
    return os.environ.get("POD_IP") or "127.0.0.1"


def retrain_schedule() -> tuple[str, str]:
    """DGX_RETRAIN_CRON and DGX_RETRAIN_TIMEZONE: when the retraining schedule fires."""
    return os.environ.get("DGX_RETRAIN_CRON") or DEFAULT_RETRAIN_CRON, os.environ.get("DGX_RETRAIN_TIMEZONE") or "UTC"


def ernie_token() -> str | None:
    """DGX_ERNIE_TOKEN: the bearer token the client sends to the serving endpoints."""
    return os.environ.get("DGX_ERNIE_TOKEN") or None


def process_defaults() -> dict[str, str]:
    """What these machines need before Spark, MLflow, GE or TensorFlow start: loopback only, the running Python
    for Spark's workers, no telemetry (there is no internet), TensorFlow's C++ log at warnings."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "GX_ANALYTICS_ENABLED": "false",
        "DAGSTER_DISABLE_TELEMETRY": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def apply_process_defaults() -> None:
    """Set `process_defaults()` in this process where the environment does not say otherwise."""
    for key, value in process_defaults().items():
        os.environ.setdefault(key, value)
