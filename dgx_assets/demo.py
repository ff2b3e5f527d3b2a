"""`make demo`: seeding the landing zone with the ELPV solar-cell images if it is empty (demo_seed.py), then
materializing every asset with a console that shows progress (demo_console.py; the full event log goes to a file).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from dgx_assets.demo_console import DemoProgress
from dgx_assets.demo_seed import seed_landing
from dgx_assets.progress import progress_of

PRODUCTION_GROUP = "production"
PRODUCTION_SHARE = 0.1  # of the ELPV images, landed without labels as the line sends them: scored, never trained on


def run_demo(limit: int | None = None, batches: int = 3, verbose: bool = False) -> int:
    """`make demo`: seed the landing zone if it is empty, then materialize every asset on the local default.

    The console shows one line per step with its status and time, and a progress bar while a long step works;
    Dagster's full event log goes to a file under `<state>/logs/` (printed first), or to the console with
    `verbose`. Exits non-zero when a step errors. A gate holding a model back (champion_model held back, a blocking
    check failed) is the pipeline working as meant: it is reported, the report is still made, and the exit is 0.
    """
    import dagster as dg

    from dgx_assets import settings
    from dgx_assets.definitions import defs as code_location
    from dgx_assets.ingest.landing import scan_landing
    from dgx_assets.partitions import IMAGE_BATCHES

    env = settings.environment()
    log_path = env.state_dir / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"Full event log: {log_path}" + ("" if verbose else "  (--verbose prints it here instead)"), flush=True)

    landing = env.landing_uri
    if not scan_landing(landing):
        from dgx_assets.generation.prompts import write_demo_prompts

        counts = seed_landing(landing, batches=batches, limit=limit, production_share=PRODUCTION_SHARE)
        write_demo_prompts(env.prompts_uri)
        print(f"Seeded {sum(counts.values())} ELPV images into {landing} ({len(counts)} batches)")
    landed = {name: state for name, state in scan_landing(landing).items() if state.complete}
    ready = list(landed)

    defs = code_location()
    generator = _build_generator_in_background((defs.resources or {})["ernie"])
    instance = dg.DagsterInstance.get()  # DAGSTER_HOME: the repository's dagster.yaml, so the UI shows these runs
    instance.add_dynamic_partitions(IMAGE_BATCHES, ready)
    per_batch, production, whole = demo_selection(defs)
    job = defs.resolve_implicit_global_asset_job_def()

    outcome = _DemoOutcome()
    with open(log_path, "a", encoding="utf-8") as log_file, _output_into(None if verbose else log_file) as console:
        progress = None if verbose else DemoProgress(console)

        def run(what: str, **options):
            if progress:
                progress.header(what)
            result = execute_for_cli(job, instance, progress=progress, log_file=log_file, **options)
            outcome.add(instance, result, what)
            return result

        for batch in ready:
            run(f"batch {batch}", partition_key=batch, asset_selection=per_batch)
        report_key = dg.AssetKey("quality_report")
        run("whole-dataset assets", asset_selection=[key for key in whole if key != report_key])
        # The champion is known now: the line's batches are scored by it, judged for drift and queued for people.
        scored = [batch for batch in ready if landed[batch].production_files]
        for batch in scored:
            run(f"production batch {batch}", partition_key=batch, asset_selection=production)
        if report_key in whole:  # last, in a run of its own: it sums up every run before it, held back or not
            run("quality report", asset_selection=[report_key])
        if generator is not None:
            generator.join()  # the build has its own time cap; never leave it running behind the demo

    lake = env.lake_root
    print(
        f"\nTook {outcome.seconds():.0f} s in {len(outcome.steps)} steps; the slowest: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in outcome.slowest(3))
    )
    print(f"Lake (Iceberg tables: dgx-assets lake snapshots; models, report): {lake}")
    print(f"Quality report: {lake}/quality_report/report.html")
    verdict = instance.get_latest_materialization_event(report_key)
    if verdict is not None and verdict.asset_materialization is not None:
        print(f"Verdict: {verdict.asset_materialization.metadata['verdict'].value}")
    print(f"MLflow store: {env.mlflow_tracking_uri}  (make mlflow-ui, then {env.mlflow_ui_url})")
    print(f"Dagster UI with these runs: make dev, then {env.dagster_ui_url}")
    print(f"Full event log: {log_path}")
    for batch in scored:
        for line in production_lines(instance, batch):
            print(line)
    for gate in outcome.gates:
        print(f"Quality gate held back what follows it: {gate}")
    if outcome.errors:
        print("FAILED: " + "; ".join(outcome.errors) + f" -- the reason is in {log_path} and in the Dagster UI (make dev)")
        return 1
    return 0


def demo_selection(defs) -> tuple[list, list, list]:
    """The asset keys `make demo` materializes: those of one batch (run per batch), those that score a batch with
    the champion (the `production` group, run per batch with production images once a champion exists), then
    the whole-dataset ones.

    Assets tagged dgx/optional (hyperparameter_search: an extra, and long) are materialized by hand, not here;
    an asset that depends on one (trained_model) runs without it."""
    graph = defs.resolve_asset_graph()
    keys = [
        key
        for key in graph.get_all_asset_keys()
        if graph.get(key).is_materializable and graph.get(key).tags.get("dgx/optional") != "true"
    ]
    partitioned = [key for key in keys if graph.get(key).partitions_def is not None]
    production = [key for key in partitioned if graph.get(key).group_name == PRODUCTION_GROUP]
    whole = [key for key in keys if graph.get(key).partitions_def is None]
    return [key for key in partitioned if key not in production], production, whole


def production_lines(instance, batch: str) -> list[str]:
    """What `make demo` prints of a scored batch: the champion's figures, the drift verdict and the queue."""
    import dagster as dg

    from dgx_assets.partitions import latest_check_evaluations
    from dgx_assets.production.drift import DRIFT_CHECK

    def latest(asset: str):
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[batch]), limit=1
        ).records
        return records[0].asset_materialization.metadata if records and records[0].asset_materialization else None

    scored = latest("defect_predictions")
    if scored is None:
        return [f"Production batch {batch}: not scored (no champion yet)"]
    rate = scored["predicted_defect_rate"].value
    lines = [
        f"Production batch {batch}: {scored['dagster/row_count'].value} images scored by {scored['model_version'].value}, "
        + (f"{rate:.1%} predicted defective" if rate is not None else "no positive class")
    ]
    drift = latest_check_evaluations(instance, dg.AssetCheckKey(dg.AssetKey("defect_predictions"), DRIFT_CHECK)).get(batch)
    if drift is not None:
        lines.append(f"  {drift[0].description}")
    queue = latest("review_queue")
    if queue is not None and queue["tasks"].value:
        lines.append(f"  review queue: {queue['tasks'].value} images for people, {queue['label_studio_tasks'].value}")
        lines.append(f"  labels back: {queue['import_labels'].value.strip('`')}")
    return lines


def _build_generator_in_background(ernie) -> threading.Thread | None:
    """Start training the stand-in ERNIE-Image generator now, while Spark ingests the batches, instead of in
    ernie_generated_images' step (about 3 minutes on a laptop CPU). The step waits for this build
    (`launcher.ensure_generator` serialises builders) and, should it fail, builds again and reports why."""
    from dgx_assets.generation import launcher

    model_dir = ernie.generator_to_build()
    if model_dir is None:
        return None
    print(f"Training the local ERNIE-Image stand-in generator into {model_dir} in the background")

    def build() -> None:
        try:
            launcher.ensure_generator(model_dir)
        except (launcher.LaunchError, OSError, subprocess.SubprocessError) as error:
            # Into the run's log (stderr is redirected there): the step's own build reports only its own outcome.
            print(f"The background generator build failed; ernie_generated_images builds again: {error}", file=sys.stderr)

    thread = threading.Thread(target=build, name="ernie-generator-build", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _output_into(file):
    """Send this process's stdout and stderr (file descriptors 1 and 2: Keras' and TensorFlow's output, Spark's
    JVM, MLflow's notices, warnings) into `file` while the runs go, and yield a stream on the real console for
    the progress view; None leaves both alone and yields stdout."""
    if file is None:
        yield sys.stdout
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    for fd in (1, 2):
        os.dup2(file.fileno(), fd)
    try:
        with contextlib.redirect_stdout(file), contextlib.redirect_stderr(file):  # Python's own print() too
            yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy_of in saved.items():
            os.dup2(copy_of, fd)
            os.close(copy_of)
        console.close()


CHECK_FAILED_ERROR = "DagsterAssetCheckFailedError"  # what Dagster raises when a blocking check holds a run back


def execute_for_cli(job, instance, progress: DemoProgress | None = None, log_file=None, **options):
    """Run `job` in this process as `make demo` does. Without `progress` the console gets Dagster's event log
    (as `--verbose`); with it, `progress` draws one line per step. `log_file` gets the full event log either way.
    A blocking check holding a run back is told by what the check found and its `to_fix` entry instead of
    a stack trace: for a CLI user that is the pipeline working, not a crash."""
    import dagster as dg

    colored = dg.colored_console_logger
    notes = RunNotes()  # this call's own: another execution (or test) never sees its runs' checks

    @dg.logger(config_schema=colored.config_schema, description=colored.description)
    def console(init_context) -> logging.Logger:
        inner = colored.logger_fn(init_context) if progress is None else None
        return _GateConsole(inner, progress, log_file, notes)

    # Only loggers named in the run config are used; DEBUG is what Dagster's default console shows.
    return job.with_logger_defs({"console": console}).execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
        **options,
    )


@dataclass
class RunNotes:
    """What the console loggers of one `execute_for_cli` call remember between records, per run: Dagster makes
    more than one logger instance for a run (its failure is logged by another), so they share this."""

    # failed blocking check -> what it found and what to fix
    fixes: dict[str, dict[str, str]] = field(default_factory=dict)
    # step -> why its asset was held back (champion_model's decision), until the step ends
    decisions: dict[str, dict[str | None, str]] = field(default_factory=dict)
    # step -> what a failed warning check found, until the step ends
    warnings: dict[str, dict[str | None, str]] = field(default_factory=dict)


class _GateConsole(logging.Logger):
    """Hands every record to the event log file and to Dagster's console logger or the progress view;
    rewrites the step and run failures a blocking check caused."""

    def __init__(
        self,
        inner: logging.Logger | None,
        progress: DemoProgress | None = None,
        log_file=None,
        notes: RunNotes | None = None,
    ):
        super().__init__("dgx_demo", logging.DEBUG)
        self._inner, self._progress, self._file = inner, progress, log_file
        self._notes = RunNotes() if notes is None else notes

    def handle(self, record: logging.LogRecord) -> None:
        import dagster as dg

        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        run = meta.get("run_id") or ""
        fixes = self._notes.fixes.setdefault(run, {})
        decided = self._notes.decisions.setdefault(run, {})
        warning_checks = self._notes.warnings.setdefault(run, {})
        held = warned = None
        if event is not None and event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            summary = _held_back(event.event_specific_data.materialization)
            if summary:
                decided[meta.get("step_key")] = summary
        elif event is not None and event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            held = decided.pop(meta.get("step_key"), None)
            warned = warning_checks.pop(meta.get("step_key"), None)
        elif event is not None and event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.event_specific_data
            if not evaluation.passed and evaluation.blocking:
                fixes[_check_name(evaluation)] = _found_and_fix(evaluation)
            elif not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN:
                warning_checks[meta.get("step_key")] = _found_and_fix(evaluation)
        elif (
            event is not None
            and getattr(getattr(event.event_specific_data, "error", None), "cls_name", None) == CHECK_FAILED_ERROR
        ):
            record = copy.copy(record)
            held = "; ".join(f"{name}: {fix}" for name, fix in fixes.items()) or "see the check's description"
            record.msg, record.args = record.msg.split("\n\n")[0] + f" A blocking check held it back. {held}", ()
        if event is not None and event.event_type in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE):
            for per_run in (self._notes.fixes, self._notes.decisions, self._notes.warnings):
                per_run.pop(run, None)
        if self._file is not None:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {record.levelname} {record.getMessage()}\n")
            self._file.flush()
        if self._inner is not None:
            self._inner.handle(record)
        if self._progress is not None:
            self._progress.event(meta.get("step_key"), event, record.getMessage(), held, progress_of(record), warned)


def _found_and_fix(evaluation) -> str:
    """A failed check in one line: its description (what it found), then its `to_fix` entry."""
    from dgx_assets.metadata import fix_of

    found = (evaluation.description or "(the check gave no description)").rstrip(".")
    fix = fix_of(evaluation.metadata or {})
    return f"{found}. To fix: {fix}" if fix else found


def _check_name(evaluation) -> str:
    return f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"


def _held_back(materialization) -> str | None:
    """Why a materialization records a held-back decision (champion_model's), or None."""
    from dgx_assets.defs.edge.champion import held_back_summary

    return held_back_summary({key: getattr(value, "value", value) for key, value in materialization.metadata.items()})


class _DemoOutcome:
    """What the demo's runs did: time per step, errors, and blocking checks that stopped downstream work."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self.errors: list[str] = []
        self.gates: list[str] = []

    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    def slowest(self, count: int) -> list[tuple[str, float]]:
        return sorted(self.steps, key=lambda step: -step[1])[:count]

    def add(self, instance, result, what: str) -> None:
        import dagster as dg

        for stats in instance.get_run_step_stats(result.run_id):
            if stats.start_time and stats.end_time:
                self.steps.append((f"{stats.step_key}[{what}]", stats.end_time - stats.start_time))
        held = [
            evaluation
            for evaluation in result.get_asset_check_evaluations()
            if not evaluation.passed and evaluation.blocking and evaluation.severity == dg.AssetCheckSeverity.ERROR
        ]
        for event in result.get_asset_materialization_events():
            summary = _held_back(event.event_specific_data.materialization)
            if summary:
                self.gates.append(f"{what}: {event.asset_key.to_user_string()}: {summary}")
        for event in result.get_step_failure_events():
            error = event.step_failure_data.error
            if error is not None and error.cls_name == CHECK_FAILED_ERROR:
                self.gates += [
                    f"{what}: {_check_name(e)}: {_found_and_fix(e) if e.description else error.message.strip()}"
                    for e in held
                    if e.asset_check_key.asset_key.to_user_string() in error.message
                ]
            else:
                self.errors.append(f"{what}: step {event.step_key} ({result.run_id})")
