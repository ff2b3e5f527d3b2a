"""Spark stage progress in the Dagster run log while a job runs, not only when it ends."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


def describe_active_stages(spark) -> list[str]:
    tracker = spark.sparkContext.statusTracker()
    lines = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            lines.append(
                f"stage {stage_id} ({info.name.split(' at ')[0]}): {info.numCompletedTasks}/{info.numTasks} tasks done, "
                f"{info.numActiveTasks} running, {info.numFailedTasks} failed"
            )
    return lines


@contextlib.contextmanager
def spark_progress(spark, log: Callable[[str], None], every_seconds: float = 10.0) -> Iterator[None]:
    """Log the active stages every `every_seconds` until the block ends (a daemon thread; cheap to poll)."""
    stop = threading.Event()
    last: list[str] = []

    def report() -> None:
        while not stop.wait(every_seconds):
            lines = describe_active_stages(spark)
            if lines and lines != last:
                log("Spark: " + "; ".join(lines))
                last[:] = lines

    thread = threading.Thread(target=report, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_seconds)
