"""The model registry's aliases: `candidate` (the latest trained version), `champion` (the promoted one)."""

from __future__ import annotations

from typing import Any

CANDIDATE_ALIAS = "candidate"
CHAMPION_ALIAS = "champion"


def current_alias_version(client: Any, model_name: str, alias: str = CHAMPION_ALIAS) -> str | None:
    """The version holding ``alias``, or None when no version does (or the model is not registered)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(model_name, alias).version)
    except MlflowException:
        return None


def alias_metric(tracking_uri: str, model_name: str, alias: str, metric: str) -> tuple[str, float] | None:
    """(version, value of ``metric`` in its training run) for the version holding ``alias``, or None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri)
    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except MlflowException:
        return None
    value = client.get_run(version.run_id).data.metrics.get(metric) if version.run_id else None
    return (str(version.version), float(value)) if value is not None else None
