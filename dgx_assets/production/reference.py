"""What a scored batch is compared with: the embeddings of the images its version was trained on, read back from
the image_features snapshot its training run recorded (Iceberg time travel), and the batch's own."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from dgx_assets.lake.files import PARTITION_COLUMN
from dgx_assets.production.scoring import PREDICTIONS_TABLE, Champion

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake

FEATURES_TABLE = "image_features"


@dataclasses.dataclass(frozen=True)
class Reference:
    embeddings: np.ndarray | None  # None: image_features holds no embeddings (built with embedding none)
    labels: list[str]
    snapshot_id: int | None  # the snapshot read: the training run's, or the current one when that has expired

    def prevalence(self, positive: str | None) -> float:
        """The share of `positive` among the training images (0 without a positive class)."""
        return sum(1 for label in self.labels if label == positive) / len(self.labels) if self.labels and positive else 0.0


def scored_version(lake: Lake, batch: str) -> tuple[str, str, list[str]]:
    """(registered model, version, predicted labels) of the batch's defect_predictions rows."""
    from pyiceberg.expressions import EqualTo

    rows = lake.tables.scan(
        PREDICTIONS_TABLE,
        ["model_name", "model_version", "predicted_label"],
        EqualTo(PARTITION_COLUMN, batch),  # pyright: ignore[reportCallIssue]
    )
    if rows is None or not rows.num_rows:
        raise ValueError(f"defect_predictions holds no rows of batch {batch!r}: materialize defect_predictions first")
    versions = set(zip(rows.column("model_name").to_pylist(), rows.column("model_version").to_pylist()))
    if len(versions) != 1:
        raise ValueError(f"defect_predictions[{batch}] mixes model versions {sorted(versions)}: re-materialize it")
    ((name, version),) = versions
    return name, version, rows.column("predicted_label").to_pylist()


def training_embeddings(lake: Lake, champion: Champion) -> Reference:
    """The usable embeddings and labels of the training split at the snapshot the version was trained on."""
    from pyiceberg.expressions import And, EqualTo

    snapshot_id = champion.training_snapshot_id
    table = lake.tables.table(FEATURES_TABLE)
    if table is None:
        raise ValueError("the lake has no image_features table")
    if snapshot_id is None or table.snapshot_by_id(snapshot_id) is None:
        snapshot_id = None  # expired by `lake maintain`, or trained before runs recorded it: today's training split
    rows = lake.tables.scan(
        FEATURES_TABLE,
        ["embedding", "label", "feature_status"],
        And(EqualTo("split", "train"), EqualTo("feature_status", "ok")),  # pyright: ignore[reportCallIssue]
        snapshot_id,
    )
    embeddings, labels = _usable(rows)
    current = table.current_snapshot()
    return Reference(embeddings, labels, snapshot_id if snapshot_id is not None else current.snapshot_id if current else None)


def batch_embeddings(lake: Lake, batch: str) -> np.ndarray | None:
    """The batch's usable embeddings (rows x dims), or None when image_features holds none."""
    from pyiceberg.expressions import And, EqualTo

    rows = lake.tables.scan(
        FEATURES_TABLE,
        ["embedding", "label", "feature_status"],
        And(EqualTo(PARTITION_COLUMN, batch), EqualTo("feature_status", "ok")),  # pyright: ignore[reportCallIssue]
    )
    return _usable(rows)[0]


def _usable(rows) -> tuple[np.ndarray | None, list[str]]:
    if rows is None or not rows.num_rows:
        return None, []
    pairs = [
        (vector, label) for vector, label in zip(rows.column("embedding").to_pylist(), rows.column("label").to_pylist()) if vector
    ]
    if not pairs:
        return None, []
    return np.asarray([vector for vector, _ in pairs], dtype=np.float32), [label for _, label in pairs]
