"""The search's MLflow run (trained_model's lineage tags and datasets), one nested run per trial, and the
best recipe written where trained_model takes it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import numpy as np

from dgx_assets.config_parts import part_of
from dgx_assets.tracking.lineage import (
    DagsterLineage,
    dataset_digest,
    feature_dataset,
)
from dgx_assets.tracking.run import prepare_run
from dgx_assets.tracking.store import TrackingConfig, check_tracking_uri, run_url
from dgx_assets.training.dataset import (
    FeatureDataError,
    FeatureFiles,
    read_embeddings,
    scan_features,
)
from dgx_assets.tuning.best_config import SEARCH_ASSET, write_best_config
from dgx_assets.tuning.config import SearchConfig
from dgx_assets.tuning.search import HeadData, SearchOutcome, run_search


@dataclasses.dataclass
class TrackedSearch:
    run_id: str
    run_url: str | None
    outcome: SearchOutcome
    best_config_uri: str
    data_digest: str


def head_data(files: FeatureFiles) -> HeadData:
    index = scan_features(files)
    train, validation = (read_embeddings(files, index, split) for split in ("train", "validation"))
    if train is None or validation is None:
        raise FeatureDataError(
            "image_features has no embeddings (built with embedding: none): re-materialize "
            "image_features with embedding efficientnet_lite0 for the search"
        )
    weights = index.class_weights()
    return HeadData(
        train[0],
        train[1],
        validation[0],
        validation[1],
        np.array([weights[i] for i in range(len(index.class_names))]),
    )


def search_and_track(
    spark: Any,
    files: FeatureFiles,
    lake: Any,
    config: SearchConfig,
    tracking: TrackingConfig,
    lineage: DagsterLineage,
    log: Any = None,
) -> TrackedSearch:
    check_tracking_uri(tracking.tracking_uri)
    data = head_data(files)
    import mlflow

    setup = prepare_run(tracking, lineage, files, SEARCH_ASSET)
    experiment_id, entries = setup.experiment_id, setup.entries
    digest = dataset_digest(entries, ["train", "validation"])
    tags = setup.tags | {"dgx.data_digest": digest, "dgx.search": "ray-tune-asha"}
    with mlflow.start_run(experiment_id=experiment_id, run_name=setup.run_name, tags=tags) as parent:
        mlflow.log_params(
            {f"search_{k}": ("" if v is None else v) for k, v in part_of(config, SearchConfig).model_dump().items()}
        )
        profile = {"num_rows": int(len(data.train_y) + len(data.val_y)), "files": len(entries), "sha256": digest}
        mlflow.log_input(
            feature_dataset(
                "image_features[train+validation]", files, lake.tables.table("image_features").location(), digest, profile
            ),
            context="training",
        )
        outcome = run_search(spark, data, config, log=log)
        for trial in outcome.trials:
            with mlflow.start_run(
                experiment_id=experiment_id,
                run_name=f"trial-{trial.trial_id or 'unknown'}",
                nested=True,
                tags={
                    "dgx.trial_id": trial.trial_id,
                    "dgx.stopped_early": str(trial.stopped_early),
                    **({"dgx.trial_error": trial.error} if trial.error else {}),
                },
            ):
                mlflow.log_params(trial.config)
                for epoch, metrics in enumerate(trial.history, start=1):
                    mlflow.log_metrics(metrics, step=epoch)
        best = {f"best_{k}": v for k, v in outcome.best_config.items()}
        mlflow.log_params(best | {"ray_worker_nodes": outcome.ray_worker_nodes})
        mlflow.log_metrics(
            {f"best_{k}": v for k, v in outcome.best_metrics.items()}
            | {"trials": len(outcome.trials), "trials_stopped_early": sum(t.stopped_early for t in outcome.trials)}
        )
        uri = write_best_config(
            lake,
            outcome.best_config,
            {
                "validation": outcome.best_metrics,
                "mlflow_run_id": parent.info.run_id,
                "data_digest": digest,
                "dagster_run_id": lineage.run_id,
                "searched_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "objective": "classifier head (dropout + softmax) on image_features' train embeddings, validation loss",
            },
        )
        mlflow.log_dict({"best": outcome.best_config, "validation": outcome.best_metrics, "uri": uri}, "search/best_config.json")
    return TrackedSearch(
        parent.info.run_id, run_url(tracking.tracking_uri, experiment_id, parent.info.run_id), outcome, uri, digest
    )
