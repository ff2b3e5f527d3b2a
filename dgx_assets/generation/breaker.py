"""One endpoint's circuit breaker and readiness, as the generation client (`client.py`) keeps them: a breaker
opens after repeated failures and lets one probe through after a cool-down."""

from __future__ import annotations

import threading
import time


class Endpoint:
    """An endpoint's circuit breaker and readiness, shared by all threads of the worker."""

    def __init__(self, url: str):
        self.url = url
        self.lock = threading.Lock()
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False
        self.ready: bool | None = None
        self.status_note = ""
        self.status_at = 0.0
        self.last_error = ""
        self.requests = 0
        self.errors = 0

    def breaker_state(self, now: float, cooldown: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now - self.opened_at >= cooldown else "open"

    def success(self) -> None:
        with self.lock:
            self.failures, self.opened_at, self.probing = 0, None, False
            self.requests += 1

    def failure(self, message: str, threshold: int) -> None:
        with self.lock:
            self.requests += 1
            self.errors += 1
            self.failures += 1
            self.last_error = message
            # A failed probe re-opens at once; otherwise open after `threshold` failures in a row.
            if self.probing or self.failures >= threshold:
                self.opened_at = time.monotonic()
            self.probing = False
