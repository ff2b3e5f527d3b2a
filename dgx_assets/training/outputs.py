"""What trained_model leaves in the lake, for the edge model and anyone else who deploys it.

``<lake>/trained_model/model.keras``: float32 pixels 0..255 of shape ``input_shape`` in (rescaling is
inside the model), softmax over ``class_names`` out. ``<lake>/trained_model/model_info.json``: the model's
contract and lineage (keys listed in ``MODEL_INFO_KEYS``). Both are written aside and swapped in together.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import posixpath
import tempfile
from pathlib import Path
from typing import Any

from dgx_assets.lake.store import Lake
from dgx_assets.tracking.registry import CANDIDATE_ALIAS
from dgx_assets.training.tracking import TrackedModel

TRAINED_MODEL_ASSET = "trained_model"
MODEL_FILE = "model.keras"
INFO_FILE = "model_info.json"
MODEL_INFO_KEYS = (
    "class_names",
    "input_shape",
    "input_dtype",
    "input_range",
    "mlflow_run_id",
    "mlflow_tracking_uri",
    "registered_model_name",
    "model_version",
    "model_alias",
    "test_metrics",
    "feature_files",
)


def lake_uri_of(lake: Lake, fs_path: str) -> str:
    """The lake URI of a path on the lake's filesystem."""
    root_path = lake.fs_path(lake.root)
    relative = posixpath.relpath(fs_path, root_path)
    return lake.uri(relative) if not relative.startswith("..") else fs_path


def model_info(
    tracked: TrackedModel, tracking_uri: str, lake: Lake, partition_keys: list[str], snapshot_id: int | None = None
) -> dict[str, Any]:
    result = tracked.training
    feature_uris = [lake_uri_of(lake, entry.path) for entry in tracked.files]
    return {
        "class_names": result.class_names,
        "input_shape": result.input_shape,  # [height, width, channels], no batch dimension
        "input_dtype": "float32",
        "input_range": [0, 255],
        "output": "softmax probabilities in class_names order",
        # How probabilities become a class (threshold on P(positive), dihedral views): the edge model, its
        # runtime, the Triton repository and the report decide the same way.
        "decision": result.decision.to_dict(),
        "model_file": MODEL_FILE,
        "mlflow_run_id": tracked.run_id,
        "mlflow_experiment_id": tracked.experiment_id,
        "mlflow_tracking_uri": tracking_uri,
        "mlflow_run_url": tracked.run_url,
        "registered_model_name": tracked.model_name,
        "model_version": tracked.model_version,
        "model_alias": CANDIDATE_ALIAS,
        "model_uri": tracked.model_uri,
        "backbone": tracked.backbone,
        "pretrained_weights": tracked.pretrained_weights,
        "test_metrics": {k: (v if math.isfinite(v) else None) for k, v in result.test.metrics.items()},
        "confusion_matrix": result.test.confusion_matrix,
        "feature_files": feature_uris,
        "feature_file_sha256": {uri: entry.sha256 for uri, entry in zip(feature_uris, tracked.files)},
        "feature_partitions": partition_keys,
        # The image_features snapshot the files belong to: `dgx-assets lake export image_features --snapshot <id>`.
        "feature_table": "dgx.image_features",
        "feature_snapshot_id": str(snapshot_id) if snapshot_id is not None else None,
        "data_digest": tracked.data_digest,
        "split_counts": result.split_counts,
        "epochs_run": result.epochs,
        "resumed_from_epoch": result.resumed_from_epoch,
        "best_epoch": result.best_epoch,
        "training_seconds": round(result.seconds, 1),
        "strategy": result.strategy,
        "replicas": result.replicas,
        "precision_policy": result.precision_policy,
        "hardware_kind": tracked.hardware.get("kind"),
        "trained_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def write_model_outputs(lake: Lake, tracked: TrackedModel, info: dict[str, Any]) -> str:
    """Write model.keras and model_info.json aside, then swap them in; returns the folder URI."""
    final = lake.asset_uri(TRAINED_MODEL_ASSET)
    staging = lake.staging_uri(TRAINED_MODEL_ASSET)
    with tempfile.TemporaryDirectory(prefix="trained_model-") as tmp:
        local = Path(tmp) / MODEL_FILE
        tracked.training.model.save(local)
        lake.write_bytes(f"{staging}/{MODEL_FILE}", local.read_bytes())
    lake.write_bytes(f"{staging}/{INFO_FILE}", json.dumps(info, indent=2, sort_keys=True).encode())
    lake.swap_in(staging, final)
    return final
