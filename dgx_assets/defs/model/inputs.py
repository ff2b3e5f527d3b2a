"""What each model asset starts from: the current image_features snapshot and where in Dagster its run comes from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import dagster as dg

if TYPE_CHECKING:
    from dgx_assets.tracking.lineage import DagsterLineage
    from dgx_assets.training.dataset import FeatureFiles


class FeatureInput(NamedTuple):
    files: FeatureFiles
    partitions: tuple[str, ...]
    snapshot: Any  # lake.tables.TableSnapshot
    lineage: DagsterLineage


def current_feature_input(context: dg.AssetExecutionContext, store: Any, code_version: str) -> FeatureInput:
    """image_features' current files and batches; a table without data fails the step with what to materialize."""
    from dgx_assets.tracking.lineage import DagsterLineage
    from dgx_assets.training.dataset import FeatureDataError, current_features

    try:
        files, partitions, snapshot = current_features(store)
    except FeatureDataError as error:
        raise dg.Failure(str(error)) from error
    lineage = DagsterLineage(
        run_id=context.run_id,
        asset_key=context.asset_key.to_user_string(),
        partition_keys=tuple(partitions),
        code_version=code_version,
        job_name=context.job_name,
    )
    return FeatureInput(files, partitions, snapshot, lineage)
