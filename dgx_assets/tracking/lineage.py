"""Where a tracked model comes from: the Dagster run, the git commit and the exact feature files it read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dgx_assets import settings

if TYPE_CHECKING:
    from dgx_assets.training.dataset import FeatureFiles

TAG_LIMIT = 5000  # MLflow's longest tag value
DIGEST_CHARS = 32  # MLflow caps a dataset digest at 36 characters


@dataclasses.dataclass(frozen=True)
class DagsterLineage:
    """Where in Dagster this training run comes from."""

    run_id: str | None = None
    asset_key: str = "trained_model"
    partition_keys: tuple[str, ...] = ()  # image_features partitions consumed
    code_version: str | None = None
    job_name: str | None = None


@dataclasses.dataclass(frozen=True)
class FileEntry:
    path: str
    size_bytes: int
    sha256: str


def describe_files(files: FeatureFiles) -> list[FileEntry]:
    """Path, size and content hash of every Parquet file, streamed (no file is held in memory)."""
    entries = []
    for path in sorted(files.paths):
        digest = hashlib.sha256()
        size = 0
        with files.filesystem.open_input_stream(path) as stream:
            while chunk := stream.read(1 << 22):
                digest.update(chunk)
                size += len(chunk)
        entries.append(FileEntry(path=path, size_bytes=size, sha256=digest.hexdigest()))
    return entries


def dataset_digest(entries: Sequence[FileEntry], splits: Sequence[str]) -> str:
    """Changes when any file's bytes change, a file is added or removed, or the splits read change."""
    payload = json.dumps({"splits": list(splits), "files": [dataclasses.asdict(e) for e in entries]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def code_revision() -> str | None:
    """The git commit of the code (DGX_GIT_COMMIT when the image was built without .git)."""
    if commit := settings.environment().git_commit:
        return commit
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=settings.repo_root(), capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None if completed.returncode == 0 else None


def snapshot_tags(files: FeatureFiles) -> dict[str, str]:
    """The Iceberg table and snapshot a run read (`dgx.table`, `dgx.snapshot_id`): `dgx-assets lake export` reads
    the same rows again from them."""
    if files.table is None or files.snapshot_id is None:
        return {}
    return {"dgx.table": files.table, "dgx.snapshot_id": str(files.snapshot_id)}


def lineage_tags(lineage: DagsterLineage, commit: str | None) -> dict[str, str]:
    """MLflow run tags that lead back to the Dagster run, its partitions and the git commit."""
    tags = {
        "dagster.asset_key": lineage.asset_key,
        "dagster.partition_keys": ",".join(lineage.partition_keys)[:TAG_LIMIT],
        "dagster.partition_count": str(len(lineage.partition_keys)),
    }
    optional = {
        "dagster.run_id": lineage.run_id,
        "dagster.code_version": lineage.code_version,
        "dagster.job": lineage.job_name,
        "mlflow.source.git.commit": commit,
        "git.commit": commit,
    }
    return tags | {key: value for key, value in optional.items() if value}


def feature_dataset(name: str, files: FeatureFiles, uri: str, digest: str, profile: dict[str, Any]) -> Any:
    """An MLflow dataset that describes Parquet files without loading them; its source names the Iceberg table
    and snapshot they are the data files of."""
    from dgx_assets.tracking.lake_dataset import FeatureDataset, LakeDatasetSource, feature_schema

    source = LakeDatasetSource(uri, files.table, files.snapshot_id)
    profile = profile | ({"table": files.table, "snapshot_id": str(files.snapshot_id)} if files.table else {})
    return FeatureDataset(source, name=name, digest=digest[:DIGEST_CHARS], schema=feature_schema(), profile=profile)


def log_feature_inputs(
    mlflow: Any,
    files: FeatureFiles,
    features_uri: str,
    entries: Sequence[FileEntry],
    lineage: DagsterLineage,
    split_counts: dict[str, dict[str, int]],
    extra: dict[str, Any] | None = None,
) -> None:
    """The feature files a run read, as an artifact and as MLflow datasets in the training and test contexts."""
    mlflow.log_dict(
        {
            "features_uri": features_uri,
            "partition_keys": list(lineage.partition_keys),
            "files": [dataclasses.asdict(e) for e in entries],
            "split_counts": split_counts,
            **(extra or {}),
        },
        "datasets/feature_files.json",
    )
    for context, splits in (("training", ["train", "validation"]), ("test", ["test"])):
        digest = dataset_digest(entries, splits)
        profile = {
            "num_rows": sum(sum(split_counts.get(split, {}).values()) for split in splits),
            "splits": {split: split_counts.get(split, {}) for split in splits},
            "files": len(entries),
            "partitions": list(lineage.partition_keys)[:200],
            "sha256": digest,
        }
        dataset = feature_dataset(f"image_features[{'+'.join(splits)}]", files, features_uri, digest, profile)
        mlflow.log_input(dataset, context=context, tags={"splits": ",".join(splits)})
