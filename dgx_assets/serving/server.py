"""The ERNIE-Image serving process: the ASGI app (app.py) on uvicorn, in a process of its own.

The listener comes up first and answers /status with "loading" while the model loads on a background
thread, so a launcher can tell "still starting" from "dead". Safe defaults: loopback only, optional bearer
token (from an environment variable, never a flag, so it stays out of `ps`), optional TLS (1.2 minimum).

Limits that hold under abuse, in the connection layer (uvicorn's h11 protocol, extended below):
- at most `max_connections` open connections; one more is answered 503 and closed;
- a request head must arrive within `header_timeout_s` of the connection or of its first byte (slow
  loris); unparseable HTTP gets a JSON 400; idle keep-alive connections close after `keep_alive_s`;
- uvicorn's access log is off (it writes query strings); app.py writes its own, and every log line goes
  through a formatter that escapes control characters.
"""

from __future__ import annotations

import contextlib
import http
import json
import logging
import os
import resource
import signal
import socket
import ssl
import sys
import threading
import unicodedata
from pathlib import Path

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from dgx_assets.serving import protocol
from dgx_assets.serving.app import ModelHolder, ServingApp
from dgx_assets.serving.config import DEFAULT_ENGINE, ServingConfig
from dgx_assets.serving.metrics import Metrics
from dgx_assets.serving.protocol import ApiError

log = logging.getLogger("dgx_assets.serving")
PARENT_PID_VARIABLE = "DGX_SERVING_PARENT_PID"  # set by dgx_assets.generation.launcher for the servers it starts
GRACEFUL_SHUTDOWN_S = 30  # in-flight generations may finish; the pods' grace period is 60 s


def guarded_protocol(config: ServingConfig, metrics: Metrics) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap, a request-head timeout and JSON for its own errors."""

    class GuardedH11Protocol(H11Protocol):
        header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            metrics.connections.set(len(self.connections))
            if len(self.connections) > config.max_connections:
                metrics.closed.labels("max_connections").inc()
                self._refuse(503, protocol.TOO_MANY_CONNECTIONS, "too many open connections; retry later")
                return
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            # A new request starts with its first byte; its head must be complete within header_timeout_s.
            if self.header_timer is None and self.conn.their_state is h11.IDLE:
                self._arm_header_timer()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._cancel_header_timer()

        def connection_lost(self, exc):
            self._cancel_header_timer()
            super().connection_lost(exc)
            metrics.connections.set(len(self.connections))

        def send_400_response(self, msg: str) -> None:
            self._refuse(400, protocol.BAD_HTTP, "invalid HTTP request")

        def _arm_header_timer(self) -> None:
            self.header_timer = self.loop.call_later(config.header_timeout_s, self._header_timed_out)

        def _cancel_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _header_timed_out(self) -> None:
            self.header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                metrics.closed.labels("header_timeout").inc()
                self._refuse(408, protocol.READ_TIMEOUT, f"request head not received within {config.header_timeout_s:g}s")

        def _refuse(self, status: int, code: int, message: str) -> None:
            """A JSON error written straight to the socket (there may be no request to answer), then close."""
            self._cancel_header_timer()
            self._unset_keepalive_if_required()
            error = ApiError(status, code, message)
            body = json.dumps(protocol.openai_error(error)).encode()
            head = [
                f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
                "content-type: application/json",
                f"content-length: {len(body)}",
                "connection: close",
                *(f"{name.lower()}: {value}" for name, value in error.headers.items()),
            ]
            self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            self.transport.close()

    return GuardedH11Protocol


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


def _tls_context(config: uvicorn.Config, default_factory) -> ssl.SSLContext:
    context = default_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _raise_open_file_limit(wanted: int) -> None:
    """Each connection is a file descriptor: make room for max_connections if the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open file limit %s is below max_connections + 256 (%s): connections past it are refused by the kernel, not answered",
            soft,
            wanted,
        )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: ServingConfig, port_file: str | None = None, engine_factory=None) -> int:
    """Run until SIGTERM/SIGINT (or the launcher's death). Returns the process exit code.

    `engine_factory(config)` replaces the configured engine (callers that build the server in-process)."""
    token = None
    if config.token_env:
        token = os.environ.get(config.token_env)
        if not token:
            log.error("token_env=%s is set but that environment variable is empty", config.token_env)
            return 2
    if config.model_dir is None and engine_factory is None and config.engine == DEFAULT_ENGINE:
        log.error("no model: pass --model-dir or set op.<service>.local_service_conf.model_config")
        return 2
    if config.host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("listening on %s without a bearer token: anyone who can reach this port can use the GPU", config.host)
    metrics = Metrics()
    model = ModelHolder(config, engine_factory)
    app = ServingApp(config, token, model, metrics)
    uv_config = uvicorn.Config(
        app,
        http=guarded_protocol(config, metrics),
        lifespan="off",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=config.keep_alive_s,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=2048,
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
        ssl_context_factory=_tls_context if config.tls_cert else None,
    )
    try:
        uv_config.load()  # reads the certificate and key now, so a bad one stops the start with its reason
    except (OSError, ssl.SSLError) as error:
        log.error("cannot load TLS certificate %s / key %s: %s", config.tls_cert, config.tls_key, error)
        return 2
    _raise_open_file_limit(config.max_connections + 256)
    try:
        sock = _listen(config.host, config.port)
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


# --- logging ---------------------------------------------------------------------------------------------


def escape_controls(text: str) -> str:
    """Control and format characters (ANSI escapes, newlines, bidi overrides) as visible escapes, so a URL
    or header cannot forge log lines or repaint a terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if unicodedata.category(ch) == "Zs":  # unusual spaces are printable enough
        return ch
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class EscapingFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s [ernie-serving pid=%(process)d] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
