"""Fixtures for the serving process: a quick generator built once (and cached by source hash), and
real serving processes on 127.0.0.1 started as separate interpreters and stopped by PID."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dgx_assets import settings
from dgx_assets.generation import launcher

CHILD_ENV = {
    "OMP_NUM_THREADS": "1",  # the test machine's few cores are shared; paddle's thread pool only fights
    "SPARK_LOCAL_IP": "127.0.0.1",
    "PYSPARK_PYTHON": sys.executable,
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "GX_ANALYTICS_ENABLED": "false",
    "DAGSTER_DISABLE_TELEMETRY": "true",
}


def quick_generator_dir() -> Path:
    """A quick generator cached under .dgx/test-cache, rebuilt when the generator's code changes."""
    cache = settings.repo_root() / ".dgx" / "test-cache" / f"quick-generator-{launcher.source_fingerprint()}"
    return launcher.ensure_generator(cache, quick=True)


@pytest.fixture(scope="session", autouse=True)
def _child_environment():
    saved = {key: os.environ.get(key) for key in CHILD_ENV}
    os.environ.update(CHILD_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def quick_model(_child_environment) -> Path:
    return quick_generator_dir()


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
