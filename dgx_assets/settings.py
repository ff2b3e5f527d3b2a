"""Where things live by default, and the environment variables that move them: one model, `Environment`, with a
field per variable (docs/architecture.md, Environment, has the table).

`environment()` reads the variables when called, never at import time: resources call it while they initialise,
so one process can point at a test lake and the next at HDFS without reimporting anything. A bad value fails
there with a pydantic error that names the variable.
"""

from __future__ import annotations

import os
import sys
import zoneinfo
from pathlib import Path
from typing import Any, Literal, Optional
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Deployment = Literal["local", "standalone", "k8s"]
DEFAULT_RETRAIN_CRON = "0 2 * * *"  # nightly, 02:00


def repo_root() -> Path:
    """The checkout this package runs from (the parent of the `dgx_assets` package)."""
    return Path(__file__).resolve().parent.parent


def _under_lake(data: dict[str, Any], *parts: str) -> str:
    return "/".join([data["lake_root"].rstrip("/"), *parts])


def _default_catalog(data: dict[str, Any]) -> str:
    root: str = data["lake_root"]
    if "://" not in root or root.startswith("file:"):
        folder = Path(urlparse(root).path) if root.startswith("file:") else Path(root).expanduser().resolve()
        return f"sqlite:///{folder / 'iceberg_catalog.db'}"
    return f"sqlite:///{data['state_dir'] / 'iceberg_catalog.db'}"


class Environment(BaseSettings):
    """Every environment variable the code location reads, with its default. The defaults that follow the lake
    (landing, prompts, catalog, warehouse) follow `with_lake()` too, unless the environment set them."""

    model_config = SettingsConfigDict(frozen=True, env_ignore_empty=True, validate_by_name=True, extra="ignore")

    state_dir: Path = Field(
        default_factory=lambda: repo_root() / ".dgx",
        validation_alias="DGX_STATE_DIR",
        description="local state: the lake, the Dagster instance data, MLflow's sqlite file, GE's context, checkpoints",
    )
    lake_root: str = Field(
        default_factory=lambda data: str(data["state_dir"] / "lake"),
        validation_alias="DGX_LAKE_ROOT",
        description="where assets write (file:// URI, plain path, hdfs:// or webhdfs://)",
    )
    landing_uri: str = Field(
        default_factory=lambda data: _under_lake(data, "landing"),
        validation_alias="DGX_LANDING_URI",
        description="where new images arrive, as <landing>/<batch>/<label>/<file>",
    )
    prompts_uri: str = Field(
        default_factory=lambda data: _under_lake(data, "prompts", "prompts.csv"),
        validation_alias="DGX_PROMPTS_URI",
        description="the prompts for the text-to-image model",
    )
    catalog_uri: str = Field(
        default_factory=_default_catalog,
        validation_alias="DGX_CATALOG_URI",
        description="the Iceberg catalog of the lake's tables: sqlite:/// or postgresql+psycopg2:// (SQL catalog), "
        "http(s):// (REST catalog), thrift:// (Hive metastore)",
    )
    catalog_warehouse: str = Field(
        default_factory=lambda data: _under_lake(data, "warehouse"),
        validation_alias="DGX_CATALOG_WAREHOUSE",
        description="where new tables' files go (file:// or hdfs://)",
    )
    # The defaults above and this one derive from other fields: declared before any field that can fail.
    mlflow_tracking_uri: str = Field(
        default_factory=lambda data: f"sqlite:///{data['state_dir'] / 'mlflow.db'}",
        validation_alias="MLFLOW_TRACKING_URI",
        description="MLflow tracking server or sqlite URI",
    )
    deployment: Deployment = Field(
        default="local",
        validation_alias="DGX_DEPLOYMENT",
        description="the Spark profile and the Dagster executor, both",
    )
    spark_master: Optional[str] = Field(
        default=None,
        validation_alias="DGX_SPARK_MASTER",
        description="Spark master URL: spark:// for standalone, k8s:// for k8s (local: local[*])",
    )
    spark_event_log: str = Field(
        default="file:///tmp/spark-events",
        validation_alias="DGX_SPARK_EVENT_LOG",
        description="the cluster profiles' Spark event log (what the History Server reads)",
    )
    k8s_namespace: str = Field(
        default="dgx-assets", validation_alias="DGX_K8S_NAMESPACE", description="namespace of the k8s Spark profile"
    )
    spark_image: str = Field(
        default="dgx-assets/code-location:0.1.0",
        validation_alias="DGX_SPARK_IMAGE",
        description="executor image of the k8s Spark profile",
    )
    pod_ip: str = Field(
        default="127.0.0.1",
        validation_alias="POD_IP",
        description="where executors reach a driver in a step pod (the downward API sets it)",
    )
    mlflow_ui_url: str = Field(
        default="http://127.0.0.1:5000",
        validation_alias="DGX_MLFLOW_UI_URL",
        description="where a browser opens MLflow (make mlflow-ui serves the default)",
    )
    dagster_ui_url: str = Field(
        default="http://127.0.0.1:3000",
        validation_alias="DGX_DAGSTER_UI_URL",
        description="where a browser opens Dagster (make dev serves the default)",
    )
    docs_url: str = Field(
        default="http://127.0.0.1:3001",
        validation_alias="DGX_DOCS_URL",
        description="where a browser opens the quality report and GE's data docs (dgx-assets docs-server)",
    )
    ernie_endpoints: str = Field(
        default="local",
        validation_alias="DGX_ERNIE_ENDPOINTS",
        description="comma-separated serving URLs, or local to launch the bundled server",
    )
    ernie_token: Optional[SecretStr] = Field(
        default=None,
        validation_alias="DGX_ERNIE_TOKEN",
        description="bearer token the client sends to the serving endpoints",
    )
    retrain_cron: str = Field(
        default=DEFAULT_RETRAIN_CRON, validation_alias="DGX_RETRAIN_CRON", description="when retraining fires"
    )
    retrain_timezone: str = Field(
        default="UTC", validation_alias="DGX_RETRAIN_TIMEZONE", description="the time zone of DGX_RETRAIN_CRON"
    )
    retrain_min_interval_s: float = Field(
        default=6 * 3600,
        ge=0,
        validation_alias="DGX_RETRAIN_MIN_INTERVAL_S",
        description="the least time between two retrainings the new-labels sensor requests",
    )
    git_commit: Optional[str] = Field(
        default=None,
        validation_alias="DGX_GIT_COMMIT",
        description="code revision tagged on MLflow runs where the image has no .git",
    )

    @field_validator("mlflow_ui_url", "dagster_ui_url", "docs_url", "ernie_endpoints")
    @classmethod
    def _trimmed(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            raise ValueError("is empty")
        return value

    @field_validator("retrain_cron")
    @classmethod
    def _five_cron_fields(cls, value: str) -> str:
        if not value.startswith("@") and len(value.split()) != 5:
            raise ValueError(f"{value!r} is not a cron expression of five fields (minute hour day month weekday)")
        return value

    @field_validator("retrain_timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as error:
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)") from error
        return value

    @property
    def retrain_schedule(self) -> tuple[str, str]:
        return self.retrain_cron, self.retrain_timezone

    @property
    def token(self) -> str | None:
        """DGX_ERNIE_TOKEN in clear, for the client's header (the field itself never shows it)."""
        return self.ernie_token.get_secret_value() if self.ernie_token else None

    def with_lake(self, root: str) -> Environment:
        """These settings for another lake (a resource's own root): what follows the lake by default follows it."""
        given = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self).model_validate(given | {"lake_root": root})


def environment() -> Environment:
    """The environment as it is now."""
    return Environment()


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
