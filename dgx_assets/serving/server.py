"""The ERNIE-Image serving process: the ASGI app (app.py) on uvicorn, in a process of its own.

The listener comes up first and answers /status with "loading" while the model loads on a background
thread, so a launcher can tell "still starting" from "dead". Safe defaults: loopback only, optional bearer
token (from an environment variable, never a flag, so it stays out of `ps`), optional TLS (1.2 minimum).

Limits that hold under abuse are the connection layer the edge runtime shares (dgx_assets/http_limits.py):
at most `max_connections` open connections, those still in their TLS handshake included (one more gets
503, or is closed at once during a handshake); `handshake_timeout_s` to finish a TLS handshake and
`header_timeout_s` to send a request head; unparseable HTTP gets a JSON 400; idle keep-alive connections
close after `keep_alive_s`. uvicorn's access log is off (it writes query strings); app.py writes its own,
and every log line goes through a formatter that escapes control characters.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import threading
from pathlib import Path

import uvicorn

from dgx_assets import http_limits
from dgx_assets.serving import protocol
from dgx_assets.serving.app import ModelHolder, ServingApp
from dgx_assets.serving.config import DEFAULT_ENGINE, ServingConfig
from dgx_assets.serving.engine import find_model
from dgx_assets.serving.metrics import Metrics
from dgx_assets.serving.protocol import ApiError

log = logging.getLogger("dgx_assets.serving")
PARENT_PID_VARIABLE = "DGX_SERVING_PARENT_PID"  # set by dgx_assets.generation.launcher for the servers it starts
GRACEFUL_SHUTDOWN_S = 30  # in-flight generations may finish; the pods' grace period is 60 s
# The connection layer's refusals, by HTTP status, as Paddle error codes.
REFUSAL_CODES = {400: protocol.BAD_HTTP, 408: protocol.READ_TIMEOUT, 503: protocol.TOO_MANY_CONNECTIONS}


def _refusal(status: int, message: str) -> tuple[bytes, dict[str, str]]:
    error = ApiError(status, REFUSAL_CODES[status], message)
    return json.dumps(protocol.openai_error(error)).encode(), error.headers


def guarded_protocol(config: ServingConfig, metrics: Metrics, tls: ssl.SSLContext | None = None):
    """The shared guarded h11 protocol with this server's limits, error format and metrics."""
    limits = http_limits.ConnectionLimits(config.max_connections, config.header_timeout_s, config.handshake_timeout_s)
    return http_limits.guarded_protocol(
        limits,
        _refusal,
        on_refused=lambda reason: metrics.closed.labels(reason).inc(),
        on_connections=metrics.connections.set,
        tls=tls,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, with signal handlers that can be put back after paddle's import replaced them,
    no re-raised signal after a graceful stop (exit code 0), and a watch on the launcher that started it."""

    def __init__(self, config: uvicorn.Config, launcher_pid: int = 0):
        super().__init__(config)
        self.launcher_pid = launcher_pid
        self.reinstall_signals = threading.Event()

    @contextlib.contextmanager
    def capture_signals(self):
        self.install_signal_handlers()
        yield

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.handle_exit)

    async def on_tick(self, counter: int) -> bool:
        if self.reinstall_signals.is_set():  # on the main thread, where signal handlers must be set
            self.reinstall_signals.clear()
            self.install_signal_handlers()
        if self.launcher_pid and counter % 5 == 0 and not _alive(self.launcher_pid):
            # Started for one run or test that has died without stopping us: nobody else will.
            log.warning("launcher pid %s is gone: stopping", self.launcher_pid)
            self.should_exit = True
        return await super().on_tick(counter)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(config: ServingConfig, port_file: str | None = None, engine_factory=None) -> int:
    """Run until SIGTERM/SIGINT (or the launcher's death). Returns the process exit code.

    `engine_factory(config)` replaces the configured engine (callers that build the server in-process)."""
    token = None
    if config.token_env:
        token = os.environ.get(config.token_env)
        if not token:
            log.error("token_env=%s is set but that environment variable is empty", config.token_env)
            return 2
    if engine_factory is None and config.engine == DEFAULT_ENGINE:
        if config.model_dir is None:
            log.error("no model: pass --model-dir or set op.<service>.local_service_conf.model_config")
            return 2
        try:  # a folder without a model is refused now, not reported later as a server that cannot load
            find_model(config.model_dir)
        except (OSError, ValueError) as error:
            log.error("no model in %s: %s", config.model_dir, error)
            return 2
    if config.host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("listening on %s without a bearer token: anyone who can reach this port can use the GPU", config.host)
    metrics = Metrics()
    model = ModelHolder(config, engine_factory)
    app = ServingApp(config, token, model, metrics)
    try:
        # The certificate and key are read now, so a bad one stops the start with its reason.
        tls = http_limits.tls_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
    except (OSError, ssl.SSLError) as error:
        log.error("cannot load TLS certificate %s / key %s: %s", config.tls_cert, config.tls_key, error)
        return 2
    # TLS is done in the protocol, so handshakes are counted and timed.
    protocol = guarded_protocol(config, metrics, tls)
    uv_config = http_limits.uvicorn_config(app, protocol, config.keep_alive_s, GRACEFUL_SHUTDOWN_S)
    http_limits.raise_open_file_limit(config.max_connections + 256)
    try:
        sock = http_limits.listen(config.host, config.port)
    except OSError as error:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, error)
        return 2
    host, port = sock.getsockname()[:2]
    if port_file:
        # Written only once the socket listens, so a launcher that asked for port 0 reads a live port.
        Path(port_file).write_text(str(port), encoding="utf-8")
    scheme = "https" if config.tls_cert else "http"
    log.info("listening on %s://%s:%s (service %s)", scheme, host, port, config.service_name)

    server = _Server(uv_config, launcher_pid=int(os.environ.get(PARENT_PID_VARIABLE) or 0))

    def load() -> None:
        model.load()
        server.reinstall_signals.set()  # paddle's import replaces the SIGTERM handler

    threading.Thread(target=load, name="model-load", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        app.pool.shutdown(wait=False, cancel_futures=True)
        sock.close()
    log.info("stopped")
    return 0
