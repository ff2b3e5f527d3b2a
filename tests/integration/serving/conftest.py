"""Fixtures for the serving process: a quick generator built once (cached by source hash), and real
serving processes on 127.0.0.1, each a separate interpreter, stopped by PID."""

from __future__ import annotations

import os

import pytest
from serving_probe import LIMITED
from support.local_servers import local_servers
from support.serving_engines import fixed_latency_args

from dgx_assets import settings


@pytest.fixture(scope="session", autouse=True)
def _servers_use_one_thread(one_paddle_thread):
    yield  # every server these tests start (root conftest: one_paddle_thread)


@pytest.fixture(scope="session")
def server(quick_model, tmp_path_factory):
    """An open (no token) serving process with default limits."""
    with local_servers(1, quick_model, log_dir=tmp_path_factory.mktemp("server-logs")) as servers:
        yield servers[0]


@pytest.fixture(scope="session")
def configured_server(quick_model, tmp_path_factory):
    """Started from the operator config file in deploy/, with its token variable set, on the CPU."""
    os.environ["ERNIE_SERVING_TOKEN"] = "test-secret-token"
    config = str(settings.repo_root() / "deploy" / "serving" / "config.yml")
    try:
        with local_servers(
            1,
            quick_model,
            config_file=config,
            log_dir=tmp_path_factory.mktemp("cfg-logs"),
            extra_args=["--device", "cpu", *fixed_latency_args(300)],
        ) as servers:
            yield servers[0]
    finally:
        os.environ.pop("ERNIE_SERVING_TOKEN", None)


@pytest.fixture(scope="session")
def limited_server(quick_model, tmp_path_factory):
    """Small limits (LIMITED) so each hostile probe hits one quickly; its log is read by the log tests."""
    args = [
        *fixed_latency_args(LIMITED["latency_ms"]),
        "--max-queue",
        str(LIMITED["max_queue"]),
        "--max-connections",
        str(LIMITED["max_connections"]),
        "--header-timeout-s",
        str(LIMITED["header_timeout_s"]),
        "--body-timeout-s",
        str(LIMITED["body_timeout_s"]),
        "--keep-alive-s",
        str(LIMITED["keep_alive_s"]),
    ]
    with local_servers(1, quick_model, log_dir=tmp_path_factory.mktemp("limited-logs"), extra_args=args) as servers:
        yield servers[0]
