"""`make demo`'s console: one line per step with its status and time, and a progress bar while a step works."""

from __future__ import annotations

import threading
import time

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
