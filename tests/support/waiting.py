"""Waiting on a condition instead of sleeping a guessed time: polls, bounded, and says what never happened."""

import time


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "condition"):
    """Return once `predicate()` is true; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")
