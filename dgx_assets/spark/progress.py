"""Spark stage progress in the Dagster run log while a job runs, not only when it ends."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from dgx_assets.progress import log_progress


def _active_stages(spark) -> list[tuple[str, int, int]]:
    """(description, tasks done, tasks) of each active stage."""
    tracker = spark.sparkContext.statusTracker()
    stages = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            line = (
                f"stage {stage_id} ({info.name.split(' at ')[0]}): {info.numCompletedTasks}/{info.numTasks} tasks done, "
                f"{info.numActiveTasks} running, {info.numFailedTasks} failed"
            )
            stages.append((line, info.numCompletedTasks, info.numTasks))
    return stages


@contextlib.contextmanager
def spark_progress(spark, log: Callable[..., None], every_seconds: float = 10.0) -> Iterator[None]:
    """Log the active stages every `every_seconds` until the block ends (a daemon thread; cheap to poll), with
    their tasks done and total as structured progress (dgx_assets/progress.py)."""
    stop = threading.Event()
    last: list[str] = []

    def report() -> None:
        while not stop.wait(every_seconds):
            stages = _active_stages(spark)
            lines = [line for line, _, _ in stages]
            if lines and lines != last:
                done, total = sum(stage[1] for stage in stages), sum(stage[2] for stage in stages)
                log_progress(log, "Spark: " + "; ".join(lines), "spark_tasks", done=done, total=total)
                last[:] = lines

    thread = threading.Thread(target=report, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_seconds)
