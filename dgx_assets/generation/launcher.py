"""Start and stop local serving processes (`python -m dgx_assets.serving`) from the driver side.

Each instance gets a free loopback port (the server binds port 0 and writes the port it got to a file,
so no two launches can race for the same number), is awaited on `/status`, and is stopped by its PID.
Nothing here imports paddle: the servers are separate interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dgx_assets import settings
from dgx_assets.lake.locks import file_lock

# What a generator folder holds; build_generator moves them in in this order, so the metadata arriving means all are whole.
MODEL_FILES = ("generator.json", "generator.pdiparams", "generator_meta.json")


class LaunchError(RuntimeError):
    """A serving process did not come up; the message carries the end of its log."""


@dataclass
class ServerProcess:
    process: subprocess.Popen
    port_file: Path
    log_path: Path
    host: str = "127.0.0.1"
    port: int | None = None
    _log_handle: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        if self.port is None:
            raise LaunchError(f"server pid {self.pid} has not reported its port yet")
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM this PID, then SIGKILL if it has not exited within `timeout_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crashed or OOM-killed server looks like to its clients."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def start_server(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_dir: str | Path | None = None,
    config_file: str | None = None,
    token_env: str | None = None,
    extra_args: Sequence[str] = (),
    env: dict | None = None,
    gpu_id: int | None = None,
) -> ServerProcess:
    """Start one serving process without waiting for it (see `wait_ready`)."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="ernie-serving-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    handle, port_path = tempfile.mkstemp(prefix="port-", dir=log_dir)
    os.close(handle)
    port_file = Path(port_path)
    port_file.write_text("")
    command = [
        sys.executable,
        "-m",
        "dgx_assets.serving",
        "serve",
        "--model-dir",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--port-file",
        str(port_file),
    ]
    if config_file:
        command += ["--config", config_file]
    if token_env:
        command += ["--token-env", token_env]
    command += list(extra_args)
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONPATH", str(settings.repo_root()))
    child_env["DGX_SERVING_PARENT_PID"] = str(os.getpid())  # the server stops itself if this process dies
    if gpu_id is not None:
        # One GPU per serving process: the process sees only its own, as device 0.
        child_env["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        command += ["--gpu-ids", "0"]
    log_path = log_dir / f"{port_file.name.replace('port-', 'server-')}.log"
    log_handle = open(log_path, "ab")
    process = subprocess.Popen(
        command, stdout=log_handle, stderr=subprocess.STDOUT, env=child_env, stdin=subprocess.DEVNULL, start_new_session=True
    )
    return ServerProcess(process, port_file, log_path, host=host, _log_handle=log_handle)


def fetch_status(url: str, timeout_s: float = 2.0) -> dict:
    """The server's /status JSON (a 503 while loading still carries it); raises OSError when unreachable."""
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read() or b"{}")


def wait_ready(servers: list[ServerProcess], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            if server.process.poll() is not None:
                raise LaunchError(
                    f"serving process pid {server.pid} exited with code {server.process.returncode}:\n{server.log_tail()}"
                )
            if server.port is None:
                text = server.port_file.read_text().strip()
                server.port = int(text) if text else None
            if server.port is None:
                continue
            try:
                status = fetch_status(server.url)
            except (OSError, ValueError):
                continue
            if status.get("status") == "ready":
                pending.remove(server)
            elif status.get("status") == "failed":
                raise LaunchError(
                    f"serving process pid {server.pid} could not load its model: {status.get('error')}\n{server.log_tail()}"
                )
        if pending and time.monotonic() > deadline:
            raise LaunchError(f"serving process pid {pending[0].pid} not ready after {timeout_s:.0f}s:\n{pending[0].log_tail()}")
        if pending:
            time.sleep(0.2)


def start_local_servers(
    count: int, model_dir: str | Path, *, gpu_ids: list[int] | None = None, timeout_s: float = 120.0, **options
) -> list[ServerProcess]:
    """Start `count` servers on free loopback ports and wait until all are ready (or stop them all)."""
    check_model_dir(model_dir)
    servers: list[ServerProcess] = []
    try:
        for index in range(count):
            gpu_id = gpu_ids[index % len(gpu_ids)] if gpu_ids else None
            servers.append(start_server(model_dir, gpu_id=gpu_id, **options))
        wait_ready(servers, timeout_s)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: list[ServerProcess]) -> None:
    for server in servers:
        server.stop()


def missing_model_files(model_dir: str | Path) -> list[str]:
    return [name for name in MODEL_FILES if not (Path(model_dir) / name).exists()]


def check_model_dir(model_dir: str | Path) -> None:
    missing = missing_model_files(model_dir)
    if missing:
        raise LaunchError(
            f"no generator in {model_dir} (missing {', '.join(missing)}): build it with "
            f"`dgx-assets build-generator --out {model_dir}` (add --quick for a seconds-long build)"
        )


def build_generator(out_dir: str | Path, quick: bool = False, extra_args: Sequence[str] = (), timeout_s: float = 900.0) -> Path:
    """Train and export the generator in a separate interpreter (paddle never enters this one).

    It is built beside `out_dir` and its files moved in one by one, the metadata last (MODEL_FILES' order): a
    reader that finds all of MODEL_FILES in `out_dir` finds them whole, even while a build is under way.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-building-", dir=out.parent) as building:
        command = [sys.executable, "-m", "dgx_assets.serving", "build-generator", "--out", building, *extra_args]
        if quick:
            command.append("--quick")
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(settings.repo_root()))
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
        if result.returncode != 0:
            raise LaunchError(f"build-generator failed ({result.returncode}):\n{result.stderr[-3000:]}")
        check_model_dir(building)
        out.mkdir(exist_ok=True)
        for name in MODEL_FILES:
            os.replace(Path(building) / name, out / name)
    return out


def ensure_generator(out_dir: str | Path, quick: bool = False, extra_args: Sequence[str] = ()) -> Path:
    """The generator in `out_dir`, built first if it is not there.

    Callers that arrive while another (thread or process) builds it wait for that build instead of starting
    a second one or starting servers on half-written files: `make demo` starts the build in the background
    while Spark ingests, and the generation step then finds it ready or waits for it.
    """
    out = Path(out_dir)
    with generator_build_lock(out):
        try:
            check_model_dir(out)
        except LaunchError:
            build_generator(out, quick=quick, extra_args=extra_args)
    return out


@contextmanager
def generator_build_lock(out_dir: str | Path) -> Iterator[None]:
    """Held while a generator is built into `out_dir`; a lock file beside it, so other processes see it too."""
    out = Path(out_dir)
    with file_lock(out.parent / f".{out.name}.lock"):
        yield
