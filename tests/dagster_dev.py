"""`dagster dev` on loopback for end-to-end tests, started in its own process group and stopped by its id."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
LOCATION, REPOSITORY = "dgx_assets", "__repository__"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def dagster_dev(tmp_path):
    """`dagster dev` (webserver + daemon) on 127.0.0.1, in its own process group, stopped by that group's id."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        f"storage:\n  sqlite:\n    base_dir: {home}/storage\n"
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    lake = tmp_path / "lake"
    env = dict(os.environ, DAGSTER_HOME=str(home), DGX_LAKE_ROOT=str(lake), DGX_STATE_DIR=str(tmp_path / "state"))
    port = free_port()
    log = open(tmp_path / "dagster-dev.log", "w")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok and _location_loaded(url):
                    break
            except requests.RequestException:
                pass
            assert process.poll() is None, (tmp_path / "dagster-dev.log").read_text()[-3000:]
            time.sleep(2)
        else:
            pytest.fail("dagster dev did not come up: " + (tmp_path / "dagster-dev.log").read_text()[-3000:])
        yield url, lake
    finally:
        os.killpg(process.pid, signal.SIGINT)  # dagster dev stops cleanly on SIGINT, not SIGTERM
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # a code-server child can outlive dagster dev
        except ProcessLookupError:
            pass
        log.close()


def gql(url, query, **variables):
    response = requests.post(url, json={"query": query, "variables": variables}, timeout=60)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def _location_loaded(url) -> bool:
    data = gql(
        url,
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus locationOrLoadError { __typename } } } } }",
    )
    entries = data["workspaceOrError"]["locationEntries"]
    return any(
        e["name"] == LOCATION and e["loadStatus"] == "LOADED" and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        for e in entries
    )
