import warnings
from collections.abc import Callable, Mapping
from typing import NamedTuple

import dagster as dg

from dgx_assets.metadata import table

# One partition per top-level batch folder of the landing zone; the new-data sensor adds them.
IMAGE_BATCHES = "image_batches"
image_batches = dg.DynamicPartitionsDefinition(name=IMAGE_BATCHES)

# A backfill of many batches runs as runs of at most this many batches, each run with one SparkSession: Spark's
# start-up is paid once per run instead of once per batch, and a failed run redoes at most this many.
MAX_BATCHES_PER_RUN = 20
# backfill_policy is marked beta in Dagster 1.13; it is the documented way to run a backfill in fewer runs.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
batch_backfill_policy = dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_BATCHES_PER_RUN)


PER_BATCH = "per_batch"  # a backfill run's summary: batch -> its summary row


class BatchResult(NamedTuple):
    metadata: dict
    data_version: dg.DataVersion | None = None


def materialize_batches(
    context: dg.AssetExecutionContext, one_batch: Callable[[str], BatchResult], summary: Callable[[str, BatchResult], dict]
) -> dg.MaterializeResult:
    """Materialize every partition of the run, one batch after the other (each committed atomically by
    ``one_batch``). A run of one batch returns that batch's result. A backfill run reports each batch as the
    materialization of its partition as soon as it is committed, so a later failure loses none of them, and
    returns a table of ``summary(batch, result)`` rows; Dagster records that last, for every partition of the run.
    """
    keys = context.partition_keys
    if len(keys) == 1:
        result = one_batch(keys[0])
        return dg.MaterializeResult(metadata=result.metadata, data_version=result.data_version)
    rows = []
    for number, key in enumerate(keys, 1):
        context.log.info(f"batch {number} of {len(keys)}: {key}")
        result = one_batch(key)
        context.log_event(dg.AssetMaterialization(asset_key=context.asset_key, partition=key, metadata=result.metadata))
        rows.append({"batch": key, **summary(key, result)})
    columns = list(rows[0])
    return dg.MaterializeResult(
        metadata={
            "batches_in_run": len(keys),
            "batches": table(columns, [[row[c] for c in columns] for row in rows]),
            PER_BATCH: dg.MetadataValue.json({row["batch"]: row for row in rows}),
        }
    )


def batch_metadata(metadata: Mapping, batch: str, key: str):
    """``key`` of a materialization's metadata for ``batch``: its own, or its row of a backfill run's summary."""
    if key in metadata:
        return metadata[key].value
    per_batch = metadata.get(PER_BATCH)
    return per_batch.value.get(batch, {}).get(key) if per_batch is not None else None


def check_each_batch(
    context: dg.AssetCheckExecutionContext, evaluate: Callable[[str], dg.AssetCheckResult]
) -> dg.AssetCheckResult:
    """The check over every batch of the run: one in a sensor or UI run, up to MAX_BATCHES_PER_RUN in a backfill
    run (the batch backfill policy). Several batches give one result that fails when any batch fails and
    names each failing batch with its own what-to-fix text."""
    results = {batch: evaluate(batch) for batch in context.partition_keys}
    if len(results) == 1:
        return next(iter(results.values()))
    failed = [batch for batch, result in results.items() if not result.passed]
    return dg.AssetCheckResult(
        passed=not failed,
        severity=next(iter(results.values())).severity,
        description=" ".join(f"[{batch}] {results[batch].description}" for batch in failed) or f"all {len(results)} batches pass",
        metadata={
            "batches": dg.MetadataValue.json(
                {batch: {"passed": result.passed, "description": result.description} for batch, result in results.items()}
            )
        },
    )


def latest_check_evaluations(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, limit: int = 200
) -> dict[str | None, tuple[dg.AssetCheckEvaluation, float]]:
    """Partition (None for an unpartitioned check) -> its latest evaluation and when it was made, among the check's
    last `limit` executions. Planned or running executions have none yet and are passed over. The time is the
    evaluation event's own: an execution record's create_timestamp has whole seconds only."""
    latest: dict[str | None, tuple[dg.AssetCheckEvaluation, float]] = {}
    for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=limit):
        event = record.event
        evaluation = event.dagster_event.event_specific_data if event and event.dagster_event else None
        if event is not None and isinstance(evaluation, dg.AssetCheckEvaluation):
            latest.setdefault(record.partition, (evaluation, event.timestamp))
    return latest
