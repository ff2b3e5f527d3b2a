"""Gathering what the other assets left: their tables in the lake (pyiceberg scans), check results in Dagster,
the MLflow run.

Every reader returns None (or an empty value) when its asset has not been built yet, so a report can be
made at any point; the verdict then says what is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from dgx_assets.generation import table as generated_table
from dgx_assets.ingest import tables
from dgx_assets.lake.store import Lake
from dgx_assets.metadata import fix_of, thresholds
from dgx_assets.partitions import latest_check_evaluations
from dgx_assets.reporting.verdict import CheckOutcome

IMAGE_STATISTICS = ("brightness", "contrast", "sharpness")
DRIFT_KS_LIMIT = 0.3  # two-sample Kolmogorov-Smirnov statistic above which a batch is flagged
DRIFT_P_VALUE = 0.01
LABEL_SHIFT_POINTS = 10.0  # a batch's class share this many points away from the other batches' ...
LABEL_SHIFT_P_VALUE = 0.01  # ... and a chi-square test that says it is no chance: the label balance shifted


@dataclass
class ReportData:
    batches: dict[str, dict] = field(default_factory=dict)
    checks: list[CheckOutcome] = field(default_factory=list)
    ge_data_docs: str | None = None
    statistics: dict[str, dict] = field(default_factory=dict)  # name -> {"reference": [...], "per_batch": {...}}
    drift: list[dict] = field(default_factory=list)  # the flagged rows of `ks`: supporting figures, not the verdict
    ks: list[dict] = field(default_factory=list)  # every batch and statistic against the training data
    label_balance: list[dict] = field(default_factory=list)  # every batch's class shares against the other batches
    model: dict | None = None  # trained_model's model_info.json
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    hardware: dict | None = None
    edge: dict | None = None  # edge_model's latest materialization metadata
    edge_ladder: dict | None = None  # parity.json's format ladder: every format tried, the one shipped and why
    generated: dict | None = None  # status counts and sample images per label
    comparison: dict | None = None  # trained_model beside challenger_model (dgx_assets/challenger/report.py)
    promotion: dict | None = None  # champion_model's latest decision (its metadata) and the run that made it
    production: list[dict] = field(default_factory=list)  # per scored batch: figures, drift, review queue (production.py)
    missing: list[str] = field(default_factory=list)


def ingestion(lake: Lake) -> dict[str, dict]:
    """Each batch's summary, from one pyiceberg scan of raw_images' current snapshot (no image bytes)."""
    table = lake.tables.scan(tables.TABLE, ["batch", *tables.SUMMARY_COLUMNS])
    if table is None:
        return {}
    batches = table.column("batch")
    return {
        batch: tables.summarize(table.filter(pc.equal(batches, batch)))  # pyright: ignore[reportAttributeAccessIssue]
        for batch in sorted(set(batches.to_pylist()))
    }


def check_outcomes(instance, check_keys) -> list[CheckOutcome]:
    """The latest result of every check, per partition for partitioned checks."""
    outcomes = []
    for key in check_keys:
        latest = latest_check_evaluations(instance, key)
        for partition, (evaluation, _) in sorted(latest.items(), key=lambda item: item[0] or ""):
            metadata = {name: getattr(value, "value", value) for name, value in (evaluation.metadata or {}).items()}
            found, fix = found_and_fix(bool(evaluation.passed), evaluation.description or "", metadata)
            outcomes.append(
                CheckOutcome(
                    asset=key.asset_key.to_user_string(),
                    check=key.name,
                    partition=partition,
                    passed=bool(evaluation.passed),
                    severity=evaluation.severity.value,
                    summary=evaluation.description or found,
                    blocking=bool(getattr(evaluation, "blocking", False)),
                    great_expectations="ge_statistics" in metadata,
                    found=found,
                    fix=fix,
                    figures=tuple(thresholds(metadata)),
                )
            )
    return outcomes


def found_and_fix(passed: bool, description: str, metadata: dict) -> tuple[str, str]:
    """What a check found (its description, its figures against their thresholds, GE's counts) and, on failure,
    what to fix (its `to_fix` entry); a failed check always gets both."""
    found, fix = description.strip().rstrip("."), fix_of(metadata)
    stats = metadata.get("ge_statistics") or {}
    if not found and stats:
        found = f"{stats.get('successful_expectations')} of {stats.get('evaluated_expectations')} expectations met"
        failing = {column: examples for column, examples in (metadata.get("failing_examples") or {}).items() if examples}
        if failing:
            found += "; failing: " + "; ".join(f"{column}: {', '.join(map(str, ex[:3]))}" for column, ex in failing.items())
    if passed:
        return found or description, ""
    return found or description, fix or "see the failing rows in the check's metadata and GE's data docs, then re-materialize"


def data_docs_url(instance, check_keys) -> str | None:
    for key in check_keys:
        for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=1):
            evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
            docs = (getattr(evaluation, "metadata", None) or {}).get("ge_data_docs")
            if docs is not None:
                return docs.value
    return None


def image_statistics(lake: Lake) -> tuple[dict[str, dict], list[dict]]:
    """Per-batch image statistics from image_features, and each batch's KS test against the training data
    (`flagged` when it drifted)."""
    from scipy.stats import ks_2samp

    table = lake.tables.scan("image_features", ["batch", "split", *IMAGE_STATISTICS])
    if table is None:
        return {}, []
    rows = table.to_pydict()
    batches = [str(batch) for batch in rows["batch"]]
    statistics, tests = {}, []
    for name in IMAGE_STATISTICS:
        reference = [v for v, split in zip(rows[name], rows["split"]) if split == "train" and v is not None]
        per_batch: dict[str, list[float]] = {}
        for value, batch in zip(rows[name], batches):
            if value is not None:
                per_batch.setdefault(batch, []).append(value)
        statistics[name] = {"reference": reference, "per_batch": dict(sorted(per_batch.items()))}
        for batch, values in sorted(per_batch.items()):
            if len(values) < 5 or len(reference) < 5:
                continue
            result: Any = ks_2samp(values, reference)  # scipy's result "bunch" class is opaque to pyright
            tests.append(
                {
                    "batch": batch,
                    "statistic": name,
                    "ks": round(float(result.statistic), 3),
                    "p_value": float(result.pvalue),
                    "flagged": bool(result.statistic > DRIFT_KS_LIMIT and result.pvalue < DRIFT_P_VALUE),
                }
            )
    return statistics, tests


def label_balance(batches: dict[str, dict]) -> list[dict]:
    """Each batch's class shares (valid images) against the other batches pooled; `flagged` when a share is
    LABEL_SHIFT_POINTS or more away and a chi-square test of the 2 x classes table gives p < LABEL_SHIFT_P_VALUE.

    A model trained on one balance and run on another is miscalibrated even when every image looks the same.
    """
    from scipy.stats import chi2_contingency

    classes = sorted({label for summary in batches.values() for label in summary.get("labels", {})})
    rows = []
    if len(batches) < 2 or len(classes) < 2:
        return rows
    for batch, summary in batches.items():
        mine = [summary["labels"].get(c, 0) for c in classes]
        rest = [sum(other["labels"].get(c, 0) for name, other in batches.items() if name != batch) for c in classes]
        if not sum(mine) or not sum(rest):
            continue
        shares = {c: n / sum(mine) for c, n in zip(classes, mine)}
        others = {c: n / sum(rest) for c, n in zip(classes, rest)}
        # The largest gap; between equal gaps (always, with two classes) the class an inspector looks for.
        gap_class = min(classes, key=lambda c: (-round(abs(shares[c] - others[c]), 9), c != "defective"))
        kept = [i for i in range(len(classes)) if mine[i] + rest[i] > 0]  # a class no batch has tests nothing
        p_value = float(chi2_contingency([[mine[i] for i in kept], [rest[i] for i in kept]])[1]) if len(kept) > 1 else 1.0  # pyright: ignore[reportArgumentType]
        points = (shares[gap_class] - others[gap_class]) * 100
        rows.append(
            {
                "batch": batch,
                "shares": shares,
                "class": gap_class,
                "share": shares[gap_class],
                "others_share": others[gap_class],
                "points": round(points, 1),
                "p_value": p_value,
                "flagged": abs(points) >= LABEL_SHIFT_POINTS and p_value < LABEL_SHIFT_P_VALUE,
            }
        )
    return rows


def model_info(lake: Lake) -> dict | None:
    uri = lake.uri("trained_model", "model_info.json")
    return json.loads(lake.read_bytes(uri)) if lake.exists(uri) else None


def mlflow_details(tracking_uri: str, run_id: str) -> tuple[dict, dict | None]:
    """Per-epoch curves and the hardware baseline logged with the training run."""
    import mlflow
    from mlflow.artifacts import load_dict
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    curves = {}
    for key in sorted(run.data.metrics):
        if key in ("loss", "val_loss", "accuracy", "val_accuracy"):
            curves[key] = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
    mlflow.set_tracking_uri(tracking_uri)
    try:
        hardware = load_dict(f"runs:/{run_id}/hardware/baseline.json")
    except Exception:  # an older run without the baseline artifact
        hardware = None
    return curves, hardware


def edge_ladder(lake: Lake) -> dict | None:
    """Every format edge_model tried, the one it shipped and why (None before edge_model's first build)."""
    from dgx_assets.edge.build import EdgeBuildError, read_parity

    try:
        return read_parity(lake).get("ladder")
    except EdgeBuildError:
        return None


def latest_metadata(instance, asset_key) -> dict | None:
    event = instance.get_latest_materialization_event(asset_key)
    if event is None:
        return None
    metadata = event.asset_materialization.metadata
    return {key: getattr(value, "value", value) for key, value in metadata.items()}


def promotion(instance) -> dict | None:
    """champion_model's latest decision: `decision` (promoted / held back), `outcome`, `reason`, `to_fix`, the
    version and champion, and `run_id`, the Dagster run that decided (None before its first materialization)."""
    import dagster as dg

    event = instance.get_latest_materialization_event(dg.AssetKey("champion_model"))
    if event is None:
        return None
    metadata = event.asset_materialization.metadata
    return {**{key: getattr(value, "value", value) for key, value in metadata.items()}, "run_id": event.run_id}


def generated_images(lake: Lake, samples_per_label: int = 6) -> dict | None:
    """Status counts and, per label, sample images with the prompt that made each (`(png, prompt)` pairs)."""
    dataset = generated_table.written_dataset(lake)
    if dataset is None:
        return None
    columns = set(dataset.schema.names)
    summary = dataset.to_table(columns=[c for c in ("status", "label") if c in columns]).to_pydict()
    counts: dict[str, int] = {}
    for status in summary.get("status", []):
        counts[status] = counts.get(status, 0) + 1
    image_column = next((c for c in ("image", "image_bytes", "png", "content") if c in columns), None)
    samples: dict[str, list[tuple[bytes, str]]] = {}
    if image_column and "label" in columns:
        wanted = ["label", "status", image_column] + [c for c in ("prompt",) if c in columns]
        for batch in dataset.to_batches(columns=wanted, batch_size=64):
            for row in batch.to_pylist():
                label = row["label"] or "(no label)"
                if row["status"] == "valid" and row[image_column] and len(samples.setdefault(label, [])) < samples_per_label:
                    samples[label].append((row[image_column], row.get("prompt") or ""))
            if samples and all(len(v) >= samples_per_label for v in samples.values()):
                break
    return {"status_counts": dict(sorted(counts.items())), "samples": samples, "rows": len(summary.get("status", []))}
