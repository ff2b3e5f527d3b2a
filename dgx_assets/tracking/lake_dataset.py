"""MLflow dataset classes for Parquet files in the lake: logged as run inputs by digest, never loaded.

Imports mlflow at module level: only ``lineage.feature_dataset`` imports this, inside a tracked run.
"""

from __future__ import annotations

import json
from typing import Any

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types import ColSpec, DataType, Schema


class LakeDatasetSource(DatasetSource):
    def __init__(self, source_uri: str):
        self._uri = source_uri

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
        return {"uri": self._uri}

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> LakeDatasetSource:
        return cls(source_dict["uri"])


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
