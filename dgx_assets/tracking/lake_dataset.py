"""MLflow dataset classes for the lake's tables: logged as run inputs by digest and snapshot id, never loaded.

Imports mlflow at module level: only ``lineage.feature_dataset`` imports this, inside a tracked run.
"""

from __future__ import annotations

import json
from typing import Any

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types import ColSpec, DataType, Schema


class LakeDatasetSource(DatasetSource):
    """A table of the lake: its location, and the Iceberg table and snapshot id read (time travel gets them back)."""

    def __init__(self, source_uri: str, table: str | None = None, snapshot_id: int | None = None):
        self._uri = source_uri
        self._table, self._snapshot_id = table, snapshot_id

    @staticmethod
    def _get_source_type() -> str:
        return "dgx_lake"

    def load(self) -> str:
        return self._uri

    @staticmethod
    def _can_resolve(raw_source: Any) -> bool:
        return False

    @classmethod
    def _resolve(cls, raw_source: Any) -> LakeDatasetSource:
        return cls(str(raw_source))

    def to_dict(self) -> dict[str, Any]:
        table = {"table": self._table, "snapshot_id": str(self._snapshot_id)} if self._table else {}
        return {"uri": self._uri} | table

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> LakeDatasetSource:
        snapshot = source_dict.get("snapshot_id")
        return cls(source_dict["uri"], source_dict.get("table"), int(snapshot) if snapshot else None)


class FeatureDataset(MetaDataset):
    """image_features' Parquet files with a profile (rows per split, files, partitions) MLflow shows."""

    def __init__(self, source: DatasetSource, *, profile: dict[str, Any], **kwargs: Any):
        self._profile = profile
        super().__init__(source, **kwargs)

    @property
    def profile(self) -> dict[str, Any]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return super().to_dict() | {"profile": json.dumps(self._profile)}


def feature_schema() -> Schema:
    return Schema(
        [
            ColSpec(DataType.string, "sha256"),
            ColSpec(DataType.string, "label"),
            ColSpec(DataType.string, "split"),
            ColSpec(DataType.binary, "tensor"),
            ColSpec(DataType.string, "tensor_shape"),
        ]
    )
