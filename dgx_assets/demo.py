"""Seeding the landing zone with the ELPV solar-cell images (the `demo` extra), as a camera line would."""

from __future__ import annotations

import copy
import logging
import posixpath
from pathlib import Path
from typing import ClassVar

from dgx_assets.lake import filesystem_for

DEFECT_THRESHOLD = 0.5  # ELPV gives expert defect probabilities 0, 1/3, 2/3, 1


def elpv_records(limit: int | None = None) -> list[dict]:
    """The ELPV images as files on disk with their label and cell type, in the package's order."""
    try:
        import elpv_dataset
    except ImportError as error:
        raise RuntimeError("seed-demo needs the ELPV images: pip install -e '.[demo]' (elpv-dataset)") from error
    data_dir = Path(elpv_dataset.__file__).parent / "data"
    records = []
    with open(data_dir / "labels.csv") as labels:
        for line in labels:
            parts = line.split()
            if len(parts) != 3:
                continue
            path, probability, cell_type = parts[0], float(parts[1]), parts[2]
            records.append(
                {
                    "file": data_dir / path,
                    "label": "defective" if probability >= DEFECT_THRESHOLD else "functional",
                    "cell_type": cell_type,
                    "probability": probability,
                }
            )
    return records[:limit] if limit else records


def seed_landing(landing_uri: str, batches: int = 3, limit: int | None = None) -> dict[str, int]:
    """Copy ELPV images (their original PNG bytes) into `<landing>/<batch>/<label>/<type>_<name>`."""
    fs, root = filesystem_for(landing_uri)
    records = elpv_records(limit)
    counts: dict[str, int] = {}
    for index, record in enumerate(records):
        batch = f"elpv-{index * batches // len(records) + 1:02d}"
        folder = posixpath.join(root, batch, record["label"])
        fs.create_dir(folder, recursive=True)
        target = posixpath.join(folder, f"{record['cell_type']}_{record['file'].name}")
        # Write aside and rename, as a well-behaved uploader does, so a sensor never sees half a file.
        with fs.open_output_stream(target + "._COPYING_") as out:
            out.write(record["file"].read_bytes())
        fs.move(target + "._COPYING_", target)
        counts[batch] = counts.get(batch, 0) + 1
    return counts


def run_demo(limit: int | None = None, batches: int = 3) -> int:
    """`make demo`: seed the landing zone if it is empty, then materialize every asset on the local default.

    Exits non-zero when a step errors. A quality gate that holds a model back (a blocking check failing)
    is the pipeline working as meant: it is reported, the quality report is still made, and the exit is 0.
    """
    import dagster as dg

    from dgx_assets import settings
    from dgx_assets.definitions import defs
    from dgx_assets.ingest.landing import scan_landing
    from dgx_assets.partitions import image_batches

    landing = settings.landing_uri()
    if not scan_landing(landing):
        from dgx_assets.generation.prompts import write_demo_prompts

        counts = seed_landing(landing, batches=batches, limit=limit)
        write_demo_prompts(settings.prompts_uri())
        print(f"Seeded {sum(counts.values())} ELPV images into {landing} ({len(counts)} batches)")
    ready = [name for name, state in scan_landing(landing).items() if state.complete]

    instance = dg.DagsterInstance.get()  # DAGSTER_HOME: the repository's dagster.yaml, so the UI shows these runs
    instance.add_dynamic_partitions(image_batches.name, ready)
    graph = defs.resolve_asset_graph()
    # Assets tagged dgx/optional (hyperparameter_search: an extra, and long) are materialized by hand, not here.
    keys = [key for key in graph.get_all_asset_keys()
            if graph.get(key).is_materializable and graph.get(key).tags.get("dgx/optional") != "true"]
    per_batch = [key for key in keys if graph.get(key).partitions_def is not None]
    whole = [key for key in keys if graph.get(key).partitions_def is None]
    job = defs.resolve_implicit_global_asset_job_def()

    outcome = _DemoOutcome()
    for batch in ready:
        outcome.add(instance, execute_for_cli(job, instance, partition_key=batch, asset_selection=per_batch),
                    f"batch {batch}")
    result = execute_for_cli(job, instance, asset_selection=whole)
    outcome.add(instance, result, "whole-dataset assets")
    report_key = dg.AssetKey("quality_report")
    if not result.asset_materializations_for_node("quality_report") and report_key in whole:
        # A gate stopped the run before the report: make the report anyway, it says what held things back.
        outcome.add(instance, execute_for_cli(job, instance, asset_selection=[report_key]), "quality report")

    lake = settings.lake_root()
    print("\nTime per step: " + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in outcome.steps))
    print(f"Lake (Parquet tables, models, report): {lake}")
    print(f"Quality report: {lake}/quality_report/report.html")
    verdict = instance.get_latest_materialization_event(report_key)
    if verdict is not None:
        print(f"Verdict: {verdict.asset_materialization.metadata['verdict'].value}")
    print(f"MLflow: {settings.mlflow_tracking_uri()}  (browse with: make mlflow-ui)")
    print("Dagster UI with these runs: make dev, then http://127.0.0.1:3000")
    for gate in outcome.gates:
        print(f"Quality gate held back what follows it: {gate}")
    if outcome.errors:
        print("FAILED: " + "; ".join(outcome.errors) + " -- open the run in the Dagster UI (make dev) for the reason")
        return 1
    return 0


CHECK_FAILED_ERROR = "DagsterAssetCheckFailedError"  # what Dagster raises when a blocking check holds a run back


def execute_for_cli(job, instance, **options):
    """Run `job` in this process as `make demo` does, logging to the console as Dagster does, except that a
    blocking check holding a run back is told by the check's description (its what-to-fix text) instead of
    a stack trace: for a CLI user that is the pipeline working, not a crash."""
    import dagster as dg
    from dagster._loggers import colored_console_logger

    @dg.logger(config_schema=colored_console_logger.config_schema, description=colored_console_logger.description)
    def console(init_context) -> logging.Logger:
        return _GateConsole(colored_console_logger.logger_fn(init_context))

    # Only loggers named in the run config are used; DEBUG is what Dagster's default console shows.
    return job.with_logger_defs({"console": console}).execute_in_process(
        instance=instance, raise_on_error=False, run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
        **options)


class _GateConsole(logging.Logger):
    """Hands every record to Dagster's console logger; rewrites the step and run failures a blocking check caused."""

    # failed blocking check -> its description, per run (the run's failure is logged by another logger instance)
    fixes: ClassVar[dict[str, dict[str, str]]] = {}

    def __init__(self, inner: logging.Logger):
        super().__init__(inner.name, inner.level)
        self._inner = inner

    def handle(self, record: logging.LogRecord) -> None:
        import dagster as dg

        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        fixes = self.fixes.setdefault(meta.get("run_id") or "", {})
        if event is not None and event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.event_specific_data
            if not evaluation.passed and evaluation.blocking:
                fixes[_check_name(evaluation)] = evaluation.description or "(the check gave no description)"
        elif event is not None and getattr(getattr(event.event_specific_data, "error", None), "cls_name", None) == \
                CHECK_FAILED_ERROR:
            record = copy.copy(record)
            told = "; ".join(f"{name}: {fix}" for name, fix in fixes.items()) or "see the check's description"
            record.msg, record.args = record.msg.split("\n\n")[0] + f" A blocking check held it back. {told}", ()
        if event is not None and event.event_type in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE):
            self.fixes.pop(meta.get("run_id") or "", None)
        self._inner.handle(record)


def _check_name(evaluation) -> str:
    return f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"


class _DemoOutcome:
    """What the demo's runs did: time per step, errors, and blocking checks that stopped downstream work."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self.errors: list[str] = []
        self.gates: list[str] = []

    def add(self, instance, result, what: str) -> None:
        import dagster as dg

        for stats in instance.get_run_step_stats(result.run_id):
            if stats.start_time and stats.end_time:
                self.steps.append((f"{stats.step_key}[{what}]", stats.end_time - stats.start_time))
        held = [evaluation for evaluation in result.get_asset_check_evaluations()
                if not evaluation.passed and evaluation.blocking and evaluation.severity == dg.AssetCheckSeverity.ERROR]
        for event in result.get_step_failure_events():
            error = event.step_failure_data.error
            if error is not None and error.cls_name == CHECK_FAILED_ERROR:
                self.gates += [f"{what}: {_check_name(e)}: {e.description or error.message.strip()}" for e in held
                               if e.asset_check_key.asset_key.to_user_string() in error.message]
            else:
                self.errors.append(f"{what}: step {event.step_key} ({result.run_id})")
