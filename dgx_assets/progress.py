"""Progress as structured log records, so a console can draw it without reading the text.

Plain-Python code reports through the ``log`` callable it was given. When that callable is a method of a
``logging.Logger`` (in an asset: ``context.log.info``, Dagster's log manager), the record also carries the
progress as a dict under ``PROGRESS_ATTR``: Dagster hands it to every logger of the run, where `make demo`'s
console reads it. Any other callable (``print``, ``list.append``) just gets the message.

Kinds and their fields:
- ``spark_tasks``: ``done``, ``total`` (the active stages' tasks);
- ``epoch``: ``epoch`` (counted from 1), ``metrics`` (name -> value);
- ``phase``: ``phase`` (what the step is doing now, in words).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

PROGRESS_ATTR = "dgx_progress"


def log_progress(log: Callable[..., Any], message: str, kind: str, **fields: Any) -> None:
    """``log(message)``, with ``{"kind": kind, **fields}`` on the record when ``log`` belongs to a Logger."""
    if isinstance(getattr(log, "__self__", None), logging.Logger):
        log(message, extra={PROGRESS_ATTR: {"kind": kind, **fields}})
    else:
        log(message)


def progress_of(record: logging.LogRecord) -> dict[str, Any] | None:
    """The progress a record carries, or None."""
    progress = getattr(record, PROGRESS_ATTR, None)
    return progress if isinstance(progress, dict) else None
