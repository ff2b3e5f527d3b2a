"""Fixtures for the serving process: a quick generator built once (cached by source hash), and real
serving processes on 127.0.0.1, each a separate interpreter, stopped by PID."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dgx_assets import settings
from dgx_assets.generation import launcher


@pytest.fixture(scope="session", autouse=True)
def _one_paddle_thread():
    # The test machine's few cores are shared; paddle's thread pool in every server only fights for them.
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    if previous is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = previous


@pytest.fixture(scope="session")
def quick_model(_one_paddle_thread) -> Path:
    return launcher.cached_quick_generator()


@pytest.fixture(scope="session")
def server(quick_model, tmp_path_factory):
    """An open (no token) serving process with default limits."""
    with launcher.local_servers(1, quick_model, log_dir=tmp_path_factory.mktemp("server-logs")) as servers:
        yield servers[0]


@pytest.fixture(scope="session")
def configured_server(quick_model, tmp_path_factory):
    """Started from the operator config file in deploy/, with its token variable set, on the CPU."""
    os.environ["ERNIE_SERVING_TOKEN"] = "test-secret-token"
    config = str(settings.repo_root() / "deploy" / "serving" / "config.yml")
    try:
        with launcher.local_servers(1, quick_model, config_file=config, log_dir=tmp_path_factory.mktemp("cfg-logs"),
                                    extra_args=["--device", "cpu", "--fixed-latency-ms", "300"]) as servers:
            yield servers[0]
    finally:
        os.environ.pop("ERNIE_SERVING_TOKEN", None)
