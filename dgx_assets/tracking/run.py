"""What every tracked run of the code location starts from: the experiment, the exact feature files it reads
(with digests), the git commit, the hardware, the lineage tags and a run name that says which asset made it."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from dgx_assets.tracking.hardware import hardware_baseline, hardware_tags
from dgx_assets.tracking.lineage import DagsterLineage, FileEntry, code_revision, describe_files, lineage_tags, snapshot_tags
from dgx_assets.tracking.store import TrackingConfig, ensure_experiment

if TYPE_CHECKING:
    from dgx_assets.training.dataset import FeatureFiles


@dataclasses.dataclass(frozen=True)
class RunSetup:
    client: Any  # an MlflowClient on the tracking store
    experiment_id: str
    entries: list[FileEntry]  # the feature files, with sizes and sha256
    commit: str | None
    hardware: dict[str, Any]
    tags: dict[str, str]  # lineage and hardware tags; callers add their own
    run_name: str


def prepare_run(tracking: TrackingConfig, lineage: DagsterLineage, files: FeatureFiles, asset: str) -> RunSetup:
    """Point mlflow at the store, make sure the experiment exists, describe the inputs and the machine.

    Callers check the tracking URI first (``store.check_tracking_uri``), before any slow work."""
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking.tracking_uri)
    client = MlflowClient(tracking.tracking_uri)
    experiment_id = ensure_experiment(client, tracking.experiment_name, tracking.tracking_uri)
    commit, hardware = code_revision(), hardware_baseline()
    return RunSetup(
        client=client,
        experiment_id=experiment_id,
        entries=describe_files(files),
        commit=commit,
        hardware=hardware,
        tags=lineage_tags(lineage, commit) | snapshot_tags(files) | hardware_tags(hardware),
        run_name=f"{asset}-{(lineage.run_id or 'adhoc')[:8]}-{time.strftime('%Y%m%d-%H%M%S')}",
    )
