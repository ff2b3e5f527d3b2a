"""The challenger's MLflow run: the lineage trained_model records (Dagster tags, git commit, hardware, the
exact feature files as datasets with digests), its params and test metrics, and the booster registered under
its own name with the alias ``challenger``. Also the challenger's model_info.json in the lake."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from typing import Any

from dgx_assets.challenger.config import ChallengerConfig
from dgx_assets.challenger.xgb import ChallengerResult, train_challenger
from dgx_assets.lake.store import Lake
from dgx_assets.tracking.lineage import (
    DagsterLineage,
    dataset_digest,
    log_feature_inputs,
)
from dgx_assets.tracking.run import prepare_run
from dgx_assets.tracking.store import TrackingConfig, check_tracking_uri, run_url
from dgx_assets.training.dataset import FeatureFiles

CHALLENGER_ASSET = "challenger_model"
CHALLENGER_ALIAS = "challenger"
INFO_FILE = "model_info.json"
MODEL_FILE = "model.ubj"


@dataclasses.dataclass
class TrackedChallenger:
    run_id: str
    run_url: str | None
    model_name: str
    model_version: str
    data_digest: str
    result: ChallengerResult
    hardware: dict[str, Any]


def train_and_track_challenger(
    spark: Any,
    files: FeatureFiles,
    uris: list[str],
    features_uri: str,
    config: ChallengerConfig,
    tracking: TrackingConfig,
    lineage: DagsterLineage,
    log: Any = None,
) -> TrackedChallenger:
    check_tracking_uri(tracking.tracking_uri)
    say = log or (lambda message: None)
    import mlflow
    from mlflow.xgboost import log_model

    setup = prepare_run(tracking, lineage, files, CHALLENGER_ASSET)
    client, experiment_id, entries = setup.client, setup.experiment_id, setup.entries
    commit, hardware = setup.commit, setup.hardware
    data_digest = dataset_digest(entries, ["train", "validation", "test"])
    tags = setup.tags | {"dgx.data_digest": data_digest, "dgx.model_family": "xgboost"}
    with mlflow.start_run(experiment_id=experiment_id, run_name=setup.run_name, tags=tags) as run:
        say(f"MLflow run {run.info.run_id} in experiment {tracking.experiment_name!r}")
        result = train_challenger(spark, files, uris, config, log=say)
        mlflow.log_params(
            result.params
            | {
                "embedding_dims": result.embedding_dims,
                **{f"{s}_images": sum(c.values()) for s, c in result.split_counts.items()},
            }
        )
        mlflow.log_dict(hardware, "hardware/baseline.json")
        log_feature_inputs(mlflow, files, features_uri, entries, lineage, result.split_counts)
        mlflow.log_metrics(
            {f"test_{k}": v for k, v in result.test.metrics.items() if math.isfinite(v)}
            | {"training_seconds": result.training_seconds, "inference_ms_per_image": result.inference_ms_per_image}
        )
        mlflow.set_tag("dgx.class_names", json.dumps(result.class_names))
        mlflow.log_dict(
            {"class_names": result.class_names, "confusion_matrix": result.test.confusion_matrix}, "evaluation/test_report.json"
        )
        info = log_model(
            result.booster,
            name="model",
            registered_model_name=tracking.registered_model_name,
            metadata={"class_names": result.class_names, "input": "image_features.embedding"},
        )
        version = str(info.registered_model_version)
        client.set_registered_model_alias(tracking.registered_model_name, CHALLENGER_ALIAS, version)
        for key, value in {"dagster.run_id": lineage.run_id, "git.commit": commit, "dgx.data_digest": data_digest}.items():
            if value:
                client.set_model_version_tag(tracking.registered_model_name, version, key, value)
        say(f"registered {tracking.registered_model_name} version {version} as {CHALLENGER_ALIAS!r}")
    return TrackedChallenger(
        run.info.run_id,
        run_url(tracking.tracking_uri, experiment_id, run.info.run_id),
        tracking.registered_model_name,
        version,
        data_digest,
        result,
        hardware,
    )


def write_challenger_outputs(lake: Lake, tracked: TrackedChallenger, tracking_uri: str) -> str:
    """<lake>/challenger_model/: the booster (UBJSON) and model_info.json, swapped in together."""
    import tempfile
    from pathlib import Path

    result = tracked.result
    info = {
        "class_names": result.class_names,
        "input": "image_features.embedding",
        "embedding_dims": result.embedding_dims,
        "model_file": MODEL_FILE,
        "mlflow_run_id": tracked.run_id,
        "mlflow_run_url": tracked.run_url,
        "mlflow_tracking_uri": tracking_uri,
        "registered_model_name": tracked.model_name,
        "model_version": tracked.model_version,
        "model_alias": CHALLENGER_ALIAS,
        "test_metrics": {k: (v if math.isfinite(v) else None) for k, v in result.test.metrics.items()},
        "confusion_matrix": result.test.confusion_matrix,
        "split_counts": result.split_counts,
        "params": result.params,
        "best_iteration": result.best_iteration,
        "training_seconds": round(result.training_seconds, 2),
        "inference_ms_per_image": result.inference_ms_per_image,
        "spark_scoring_seconds": round(result.spark_scoring_seconds, 3),
        "data_digest": tracked.data_digest,
        "hardware_kind": tracked.hardware.get("kind"),
        "trained_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    staging, final = lake.staging_uri(CHALLENGER_ASSET), lake.asset_uri(CHALLENGER_ASSET)
    with tempfile.TemporaryDirectory(prefix="challenger-") as tmp:
        model_path = Path(tmp) / MODEL_FILE
        result.booster.save_model(str(model_path))
        lake.write_bytes(f"{staging}/{MODEL_FILE}", model_path.read_bytes())
    lake.write_bytes(f"{staging}/{INFO_FILE}", json.dumps(info, indent=2).encode())
    lake.swap_in(staging, final)
    return final


def read_challenger_info(lake: Lake) -> dict[str, Any] | None:
    uri = f"{lake.asset_uri(CHALLENGER_ASSET)}/{INFO_FILE}"
    return json.loads(lake.read_bytes(uri)) if lake.exists(uri) else None
