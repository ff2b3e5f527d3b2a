"""The MLflow tracking store: its settings, a fail-fast reachability check, the experiment, links to runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

from dgx_assets import links

DEFAULT_EXPERIMENT = "dgx_assets"
DEFAULT_REGISTERED_MODEL = "dgx_defect_classifier"
TRACKING_SETTING = "MLFLOW_TRACKING_URI (resource 'mlflow', field 'tracking_uri')"

# MLflow 3's UI opens an experiment on its GenAI overview unless this tag says it holds model training runs.
EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT = "mlflow.experimentKind", "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the description the MLflow UI shows (Markdown) for experiments and runs
EXPERIMENT_DESCRIPTION = (
    "Training runs of the dgx_assets `trained_model` asset: a defect classifier on solar-cell "
    "electroluminescence images, one run per Dagster materialization (tags `dagster.*` link back)."
)


class TrackingConfigError(ValueError):
    """The MLflow settings cannot work; the message names the setting."""


class TrackingSettings(BaseModel):
    """The `mlflow` resource's settings, declared once (the resource subclasses this)."""

    tracking_uri: Optional[str] = Field(
        default=None, description="MLflow tracking store; None: MLFLOW_TRACKING_URI, else sqlite under .dgx/"
    )
    experiment_name: str = Field(default=DEFAULT_EXPERIMENT, description="MLflow experiment the training runs are logged in")
    registered_model_name: str = Field(
        default=DEFAULT_REGISTERED_MODEL, description="Registered model that every training run adds a version to"
    )
    ui_url: Optional[str] = Field(
        default=None, description="Where a browser opens MLflow (links in Dagster and the report); None: DGX_MLFLOW_UI_URL"
    )


class TrackingConfig(TrackingSettings):
    """The settings resolved for one tracked run, every default filled in: built by the `mlflow` resource
    (``tracking_config()``)."""

    model_config = ConfigDict(frozen=True)

    tracking_uri: str  # pyright: ignore[reportGeneralTypeIssues]  # required: resolved, never None here
    ui_url: str = ""  # pyright: ignore[reportIncompatibleVariableOverride]  # resolved; "" where no UI links are wanted
    dagster_ui_url: Optional[str] = None  # where a browser opens Dagster (links back from MLflow)


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when the tracking store cannot be reached."""
    if not uri:
        raise TrackingConfigError(f"no MLflow tracking URI configured: set {TRACKING_SETTING}")
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
            response.raise_for_status()
        except requests.RequestException as exc:
            raise TrackingConfigError(
                f"MLflow tracking server {uri!r} is unreachable ({type(exc).__name__}: {exc}); start it or fix {TRACKING_SETTING}"
            ) from exc
        return
    if scheme == "sqlite":
        database = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
        if not database or database == ":memory:":
            raise TrackingConfigError(f"{uri!r} is not a sqlite file URI (sqlite:////abs/path.db): fix {TRACKING_SETTING}")
        _ensure_writable_dir(Path(database).parent, uri)
        return
    if scheme in ("", "file"):
        _ensure_writable_dir(Path(urlparse(uri).path if scheme else uri), uri)
        return
    if scheme not in ("databricks", "postgresql", "mysql", "mssql"):
        raise TrackingConfigError(f"unsupported MLflow tracking URI scheme {scheme!r} in {uri!r}: fix {TRACKING_SETTING}")


def _ensure_writable_dir(folder: Path, uri: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingConfigError(f"cannot create {folder} for MLflow store {uri!r} ({exc}): fix {TRACKING_SETTING}") from exc
    if not os.access(folder, os.W_OK):
        raise TrackingConfigError(f"{folder} for MLflow store {uri!r} is not writable: fix {TRACKING_SETTING}")


def default_artifact_location(tracking_uri: str) -> str | None:
    """Next to a sqlite store (MLflow would otherwise write ./mlruns wherever the process runs)."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    return None


def ensure_experiment(client: Any, name: str, tracking_uri: str) -> str:
    """The experiment's id, created when missing; tagged as a model-training experiment either way."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        experiment_id = client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))
        tags = {}
    else:
        experiment_id, tags = experiment.experiment_id, experiment.tags
    if tags.get(EXPERIMENT_KIND_TAG) != TRAINING_EXPERIMENT:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT)
    if not tags.get(DESCRIPTION_TAG):
        client.set_experiment_tag(experiment_id, DESCRIPTION_TAG, EXPERIMENT_DESCRIPTION)
    return experiment_id


def run_url(tracking_uri: str, experiment_id: str, run_id: str, ui_url: str | None = None) -> str | None:
    """The run's page in the MLflow UI: under `ui_url`, else under an http(s) tracking server, else None."""
    if ui_url:
        return links.mlflow_run(ui_url, experiment_id, run_id)
    if urlparse(tracking_uri).scheme in ("http", "https"):
        return links.mlflow_run(tracking_uri, experiment_id, run_id)
    return None
