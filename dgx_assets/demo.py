"""`make demo`: seeding the landing zone with the ELPV solar-cell images (the `demo` extra), as a camera line
would, then materializing every asset with a console that shows progress (the full event log goes to a file)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import posixpath
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

from dgx_assets.lake.files import filesystem_for
from dgx_assets.progress import progress_of

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


def seed_landing(landing_uri: str, batches: int = 3, limit: int | None = None, package_order: bool = False) -> dict[str, int]:
    """Copy ELPV images (their original PNG bytes) into `<landing>/<batch>/<label>/<type>_<name>`.

    The batches are a stable random deal, as a production line delivers a steady mix of cells. ELPV's own file
    order groups cells by type and defect rate, so `package_order` batches differ for real: the report flags
    their drift and label shift."""
    fs, root = filesystem_for(landing_uri)
    records = elpv_records(limit)
    if not package_order:
        records.sort(key=lambda record: hashlib.sha256(record["file"].name.encode()).hexdigest())
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

    log_path = settings.state_dir() / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"Full event log: {log_path}" + ("" if verbose else "  (--verbose prints it here instead)"), flush=True)

    landing = settings.landing_uri()
    if not scan_landing(landing):
        from dgx_assets.generation.prompts import write_demo_prompts

        counts = seed_landing(landing, batches=batches, limit=limit)
        write_demo_prompts(settings.prompts_uri())
        print(f"Seeded {sum(counts.values())} ELPV images into {landing} ({len(counts)} batches)")
    ready = [name for name, state in scan_landing(landing).items() if state.complete]

    defs = code_location()
    generator = _build_generator_in_background((defs.resources or {})["ernie"])
    instance = dg.DagsterInstance.get()  # DAGSTER_HOME: the repository's dagster.yaml, so the UI shows these runs
    instance.add_dynamic_partitions(IMAGE_BATCHES, ready)
    per_batch, whole = demo_selection(defs)
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
        result = run("whole-dataset assets", asset_selection=whole)
        report_key = dg.AssetKey("quality_report")
        if not result.asset_materializations_for_node("quality_report") and report_key in whole:
            # A gate stopped the run before the report: make the report anyway, it says what held things back.
            run("quality report", asset_selection=[report_key])
        if generator is not None:
            generator.join()  # the build has its own time cap; never leave it running behind the demo

    lake = settings.lake_root()
    print(
        f"\nTook {outcome.seconds():.0f} s in {len(outcome.steps)} steps; the slowest: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in outcome.slowest(3))
    )
    print(f"Lake (Iceberg tables: dgx-assets lake snapshots; models, report): {lake}")
    print(f"Quality report: {lake}/quality_report/report.html")
    verdict = instance.get_latest_materialization_event(report_key)
    if verdict is not None and verdict.asset_materialization is not None:
        print(f"Verdict: {verdict.asset_materialization.metadata['verdict'].value}")
    print(f"MLflow store: {settings.mlflow_tracking_uri()}  (make mlflow-ui, then {settings.mlflow_ui_url()})")
    print(f"Dagster UI with these runs: make dev, then {settings.dagster_ui_url()}")
    print(f"Full event log: {log_path}")
    for gate in outcome.gates:
        print(f"Quality gate held back what follows it: {gate}")
    if outcome.errors:
        print("FAILED: " + "; ".join(outcome.errors) + f" -- the reason is in {log_path} and in the Dagster UI (make dev)")
        return 1
    return 0


def demo_selection(defs) -> tuple[list, list]:
    """The asset keys `make demo` materializes: those of one batch (run per batch), then the whole-dataset ones.

    Assets tagged dgx/optional (hyperparameter_search: an extra, and long) are materialized by hand, not here;
    an asset that depends on one (trained_model) runs without it."""
    graph = defs.resolve_asset_graph()
    keys = [
        key
        for key in graph.get_all_asset_keys()
        if graph.get(key).is_materializable and graph.get(key).tags.get("dgx/optional") != "true"
    ]
    per_batch = [key for key in keys if graph.get(key).partitions_def is not None]
    return per_batch, [key for key in keys if graph.get(key).partitions_def is None]


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
    A blocking check holding a run back is told by the check's description (its what-to-fix text) instead of
    a stack trace: for a CLI user that is the pipeline working, not a crash."""
    import dagster as dg

    colored = dg.colored_console_logger

    @dg.logger(config_schema=colored.config_schema, description=colored.description)
    def console(init_context) -> logging.Logger:
        inner = colored.logger_fn(init_context) if progress is None else None
        return _GateConsole(inner, progress, log_file)

    # Only loggers named in the run config are used; DEBUG is what Dagster's default console shows.
    return job.with_logger_defs({"console": console}).execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
        **options,
    )


class _GateConsole(logging.Logger):
    """Hands every record to the event log file and to Dagster's console logger or the progress view;
    rewrites the step and run failures a blocking check caused."""

    # failed blocking check -> its description, per run (the run's failure is logged by another logger instance)
    fixes: ClassVar[dict[str, dict[str, str]]] = {}
    # step -> why its asset was held back (champion_model's decision), per run, until the step ends
    decisions: ClassVar[dict[str, dict[str | None, str]]] = {}
    # step -> what a failed warning check found, per run, until the step ends
    warnings: ClassVar[dict[str, dict[str | None, str]]] = {}

    def __init__(self, inner: logging.Logger | None, progress: DemoProgress | None = None, log_file=None):
        super().__init__("dgx_demo", logging.DEBUG)
        self._inner, self._progress, self._file = inner, progress, log_file

    def handle(self, record: logging.LogRecord) -> None:
        import dagster as dg

        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        run = meta.get("run_id") or ""
        fixes = self.fixes.setdefault(run, {})
        decided = self.decisions.setdefault(run, {})
        warning_checks = self.warnings.setdefault(run, {})
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
                fixes[_check_name(evaluation)] = evaluation.description or "(the check gave no description)"
            elif not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN:
                warning_checks[meta.get("step_key")] = evaluation.description or "(the check gave no description)"
        elif (
            event is not None
            and getattr(getattr(event.event_specific_data, "error", None), "cls_name", None) == CHECK_FAILED_ERROR
        ):
            record = copy.copy(record)
            held = "; ".join(f"{name}: {fix}" for name, fix in fixes.items()) or "see the check's description"
            record.msg, record.args = record.msg.split("\n\n")[0] + f" A blocking check held it back. {held}", ()
        if event is not None and event.event_type in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE):
            for per_run in (self.fixes, self.decisions, self.warnings):
                per_run.pop(run, None)
        if self._file is not None:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {record.levelname} {record.getMessage()}\n")
            self._file.flush()
        if self._inner is not None:
            self._inner.handle(record)
        if self._progress is not None:
            self._progress.event(meta.get("step_key"), event, record.getMessage(), held, progress_of(record), warned)


_WORKING_BAR = "{desc}  working {elapsed}"
_TASKS_BAR = "{desc} |{bar}| {n_fmt}/{total_fmt} Spark tasks [{elapsed}]"
_EPOCHS_BAR = "{desc}  epoch {n_fmt} done [{elapsed}]  {postfix}"


class DemoProgress:
    """`make demo`'s console: one line per step (status and time) and, on a terminal, a progress bar while a
    step works: Spark tasks for ingest, features and generation, epochs for training, elapsed time for the
    generator build."""

    def __init__(self, stream, bars: bool | None = None):
        self.stream = stream
        self.bars = stream.isatty() if bars is None else bars
        self.started: dict[str, float] = {}
        self._bar = None
        self._ticker: threading.Thread | None = None

    def header(self, text: str) -> None:
        self._close_bar()
        print(f"\n{text}", file=self.stream, flush=True)

    def event(
        self,
        step: str | None,
        event,
        message: str,
        held: str | None = None,
        progress: dict | None = None,
        warned: str | None = None,
    ) -> None:
        """One record of the run: a Dagster event (step started or ended) or, while a step works, the structured
        progress the record carries (dgx_assets/progress.py); the text is shown, never parsed. `held`: why the
        step's asset was held back; `warned`: what the step's failed warning check found."""
        import dagster as dg

        kind = event.event_type if event is not None else None
        if kind == dg.DagsterEventType.STEP_START and step:
            self.started[step] = time.monotonic()
            self._open_bar(step, unit="tasks")
        elif (
            kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_SKIPPED)
            and step
        ):
            self._close_bar()
            seconds = time.monotonic() - self.started.pop(step, time.monotonic())
            if held:
                status = "held back"
            elif warned and kind == dg.DagsterEventType.STEP_SUCCESS:
                status = "warning"
            elif kind == dg.DagsterEventType.STEP_SUCCESS:
                status = "ok"
            elif kind == dg.DagsterEventType.STEP_SKIPPED:
                status = "skipped"
            else:
                status = "FAILED"
            self._line(f"  {step:<46} {status:<10} {seconds:7.1f} s")
            if held:
                self._line(f"      what to fix: {held}")
            elif warned and status == "warning":
                self._line(f"      {warned.splitlines()[0][:300]}")
            elif status == "FAILED":
                self._line(f"      {message.splitlines()[0][:300]}")
        elif progress is not None and step and self._bar is not None:
            self._advance(progress)

    def _advance(self, progress: dict) -> None:
        bar = self._bar
        assert bar is not None  # event() advances only an open bar
        kind = progress.get("kind")
        if kind == "spark_tasks":
            bar.unit, bar.total, bar.n = "tasks", int(progress["total"]), int(progress["done"])
            bar.bar_format = _TASKS_BAR
        elif kind == "epoch":
            bar.unit, bar.total, bar.n = "epochs", None, int(progress["epoch"])
            bar.bar_format = _EPOCHS_BAR
            metrics = ", ".join(f"{name}={value:.4f}" for name, value in progress.get("metrics", {}).items())
            bar.set_postfix_str(metrics[:70], refresh=False)
        elif kind == "phase":
            bar.set_description_str(str(progress["phase"]), refresh=False)
        else:
            return
        bar.refresh()

    def _open_bar(self, step: str, unit: str) -> None:
        self._close_bar()
        if not self.bars:
            return
        from tqdm import tqdm

        self._bar = tqdm(
            desc=f"  {step}", total=None, unit=unit, file=self.stream, leave=False, dynamic_ncols=True, bar_format=_WORKING_BAR
        )
        self._ticker = threading.Thread(target=self._tick, args=(self._bar,), daemon=True)
        self._ticker.start()

    def _tick(self, bar) -> None:
        """Keeps the elapsed time moving while a step logs nothing (the generator build, a long epoch)."""
        while self._bar is bar:
            time.sleep(1.0)
            if self._bar is bar:
                bar.refresh()

    def _close_bar(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


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
                    f"{what}: {_check_name(e)}: {e.description or error.message.strip()}"
                    for e in held
                    if e.asset_check_key.asset_key.to_user_string() in error.message
                ]
            else:
                self.errors.append(f"{what}: step {event.step_key} ({result.run_id})")
