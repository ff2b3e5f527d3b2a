"""`dgx-assets docs-server` as `make dev` starts it, for the tests: a real process on 127.0.0.1, stopped by SIGINT."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from support.waiting import wait_for


@contextlib.contextmanager
def docs_server(port: int, env: dict, log_path: Path):
    """Yields (base URL, process) once the server answers; `env` holds its DGX_LAKE_ROOT and DGX_STATE_DIR."""
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dgx-assets"), "docs-server"],
            env={**os.environ, **env, "DGX_DOCS_URL": base},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def answers() -> bool:
            assert process.poll() is None, log_path.read_text()
            try:
                requests.head(base, timeout=1)
            except requests.ConnectionError:
                return False
            return True

        try:
            wait_for(answers, timeout_s=60, interval_s=0.2, what=f"the docs server on {base}")
            yield base, process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # as Ctrl-C in `make dev`
                process.wait(timeout=20)
