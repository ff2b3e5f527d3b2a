"""Real serving processes for the client and generation tests: healthy ones and deliberately faulty ones
(the real server with the tests' faulty engine, tests/support/serving_engines.py), all on 127.0.0.1, stopped by PID."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.serving_engines import faulty_args

from dgx_assets.generation import launcher


@pytest.fixture(scope="session", autouse=True)
def _servers_use_one_thread(one_paddle_thread):
    yield  # every server these tests start (root conftest: one_paddle_thread)


class Fleet:
    """Named serving processes started together (their start-up overlaps) and stopped together."""

    def __init__(self, model: Path, log_dir: Path, specs: dict[str, list[str]]):
        self.servers = {
            name: launcher.start_server(model, log_dir=log_dir / name, extra_args=args) for name, args in specs.items()
        }
        try:
            launcher.wait_ready(list(self.servers.values()), timeout_s=180)
        except BaseException:
            self.stop()
            raise

    def __getitem__(self, name: str) -> launcher.ServerProcess:
        return self.servers[name]

    def stop(self) -> None:
        launcher.stop_servers(list(self.servers.values()))


@pytest.fixture(scope="session")
def fleet(quick_model, tmp_path_factory):
    """Two healthy servers, one that always answers 503, one too slow for a short read timeout, one that
    always cuts its PNGs short."""
    started = Fleet(
        quick_model,
        tmp_path_factory.mktemp("fleet"),
        {
            "a": [],
            "b": [],
            "unavailable": faulty_args("unavailable"),
            "slow": faulty_args("slow", delay_ms=3000),
            "truncating": faulty_args("truncate"),
        },
    )
    yield started
    started.stop()


@pytest.fixture
def start_fleet(quick_model, tmp_path):
    """Start servers just for one test (they may be killed or carry a limited fault budget)."""
    fleets = []

    def start(**specs):
        fleets.append(Fleet(quick_model, tmp_path / f"fleet{len(fleets)}", specs))
        return fleets[-1]

    yield start
    for started in fleets:
        started.stop()


@pytest.fixture
def dead_url():
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def spark():
    """One small local Spark for the session (the asset tests' SparkResource picks the same one up)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("generation-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()
