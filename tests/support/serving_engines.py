"""Engines for tests and benchmarks, plugged into a serving process with `--engine` (not part of the product).

Both wrap the real exported generator (`dgx_assets.serving.engine.load_engine`), so images are still the
model's own; they add what a benchmark or a resilience test needs and production must never do:

- `fixed_latency` (`--engine-option latency_ms=N`): each request keeps its inference thread at least N ms,
  so a benchmark of the client and server runs against a known model time. The server admits one request
  per inference thread, so a queued request still costs the full model time, as on a GPU.
- `faulty` (`--engine-option fault=unavailable|slow|truncate|garbage`, optional `count=N`, `delay_ms=MS`):
  answer 503 (the engine is unavailable), answer late, cut the PNG in half, or return bytes that are not
  an image, for every request or the first N.

    dgx-assets serve --model-dir DIR --engine tests.support.serving_engines:fixed_latency --engine-option latency_ms=100

The serving process imports this module as `tests.support.serving_engines` (`launcher.start_server` puts the
repository root on its PYTHONPATH), whatever name the caller imported it by.
"""

from __future__ import annotations

import os
import threading
import time

FAULTS = ("unavailable", "slow", "truncate", "garbage")
ENGINES = "tests.support.serving_engines"  # the name the serving process imports this module by


class _Wrapped:
    """Everything the server reads from an engine comes from the real one, except `generate`."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def tokenize(self, prompt):
        return self.inner.tokenize(prompt)


class FixedLatency(_Wrapped):
    def __init__(self, inner, latency_s: float):
        super().__init__(inner)
        self.latency_s = latency_s

    def generate(self, tokenized, seed, width, height, count=1, timeout_s=None):
        until = time.monotonic() + self.latency_s
        images = self.inner.generate(tokenized, seed, width, height, count, timeout_s=timeout_s)
        remaining = until - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        return images


class Faulty(_Wrapped):
    def __init__(self, inner, fault: str, count: int = 0, delay_s: float = 0.0):
        super().__init__(inner)
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.fault, self.delay_s = fault, delay_s
        self.left = count if count > 0 else None  # None: every request
        self.lock = threading.Lock()

    def _take(self) -> bool:
        with self.lock:
            if self.left is None:
                return True
            if self.left > 0:
                self.left -= 1
                return True
            return False

    def generate(self, tokenized, seed, width, height, count=1, timeout_s=None):
        from dgx_assets.serving.engine import EngineUnavailable

        fault = self.fault if self._take() else None
        if fault == "unavailable":
            raise EngineUnavailable("injected fault")
        if fault == "slow":
            time.sleep(self.delay_s)
        images = self.inner.generate(tokenized, seed, width, height, count, timeout_s=timeout_s)
        if fault == "truncate":
            return [png[: len(png) // 2] for png in images]
        if fault == "garbage":
            return [os.urandom(len(png)) for png in images]
        return images


def fixed_latency(config):
    from dgx_assets.serving.engine import load_engine

    options = dict(config.engine_options)
    return FixedLatency(load_engine(config), float(options["latency_ms"]) / 1000.0)


def faulty(config):
    from dgx_assets.serving.engine import load_engine

    options = dict(config.engine_options)
    return Faulty(load_engine(config), options["fault"], int(options.get("count", 0)), float(options.get("delay_ms", 0)) / 1000.0)


def fixed_latency_args(latency_ms: float) -> list[str]:
    """The `dgx-assets serve` arguments that plug in `fixed_latency`."""
    return ["--engine", f"{ENGINES}:fixed_latency", "--engine-option", f"latency_ms={latency_ms:g}"]


def faulty_args(fault: str, count: int = 0, delay_ms: float = 0.0) -> list[str]:
    """The `dgx-assets serve` arguments that plug in `faulty`."""
    args = ["--engine", f"{ENGINES}:faulty", "--engine-option", f"fault={fault}"]
    if count:
        args += ["--engine-option", f"count={count}"]
    if delay_ms:
        args += ["--engine-option", f"delay_ms={delay_ms:g}"]
    return args
