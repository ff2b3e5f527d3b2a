"""The ERNIE-Image serving process: Paddle Inference behind HTTP, in a process of its own.

Routes:
  POST /<service>/prediction    Paddle Serving pipeline format (see protocol.py)
  POST /v1/images/generations   OpenAI-compatible, as SGLang serves the real ERNIE-Image
  GET  /status                  {"status": "loading" | "ready" | "failed", ...}; 200 only when ready
  GET  /metrics                 Prometheus text format

The HTTP listener comes up first and answers /status with "loading" while the model loads in the
background, so a launcher can tell "still starting" from "dead". Safe defaults: loopback only, optional
bearer token (from an environment variable, never a flag, so it stays out of `ps`), a request body limit,
size/step/count limits, prompt truncation to the model's token limit.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dgx_assets.serving import protocol
from dgx_assets.serving.config import ServingConfig
from dgx_assets.serving.metrics import Metrics
from dgx_assets.serving.protocol import ApiError

log = logging.getLogger("dgx_assets.serving")
OPENAI_ROUTE = "/v1/images/generations"


class ModelHolder:
    """Loads the engine in the background and tells /status how far it got."""

    def __init__(self, config: ServingConfig):
        self.config = config
        self.state = "loading"
        self.error = ""
        self.engine = None
        self.device = ""

    def load(self) -> None:
        try:
            from dgx_assets.serving.engine import GeneratorEngine

            c = self.config
            engine = GeneratorEngine(c.model_dir, device=c.device, gpu_ids=c.gpu_ids, ir_optim=c.ir_optim,
                                     concurrency=c.concurrency, cpu_threads=c.cpu_threads,
                                     gpu_memory_mb=c.gpu_memory_mb)
            if c.limits.max_prompt_tokens:
                engine.tokenizer.max_tokens = min(engine.tokenizer.max_tokens, c.limits.max_prompt_tokens)
            self.engine, self.device = engine, engine.device.kind
            if engine.device.note:
                log.warning(engine.device.note)
            self.state = "ready"
            log.info("model ready on %s from %s", self.device, c.model_dir)
        except Exception as error:  # reported on /status; the process stays up so the reason can be read
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
            log.error("model failed to load: %s", self.error)


class ErnieServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, config: ServingConfig, token: str | None):
        self.config = config
        self.token = token
        self.model = ModelHolder(config)
        self.metrics = Metrics()
        self.started = time.time()
        self._fault_lock = threading.Lock()
        self._faults_left = config.fault_count if config.fault_count > 0 else None
        super().__init__((config.host, config.port), Handler)

    def take_fault(self) -> str | None:
        """The fault to inject into this generation request, if any (first N requests, or all)."""
        if not self.config.fault:
            return None
        with self._fault_lock:
            if self._faults_left is None:
                return self.config.fault
            if self._faults_left > 0:
                self._faults_left -= 1
                return self.config.fault
        return None


class Handler(BaseHTTPRequestHandler):
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections across requests
    server: ErnieServer
    timeout = 60  # seconds a client may stall while sending; stops slow-loris connections hogging threads

    # --- routing ---------------------------------------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/status":
            self._status()
        elif path == "/metrics":
            if self._authorized("metrics"):
                self._send(200, self.server.metrics.render(self.server.model.state).encode(),
                           "text/plain; version=0.0.4; charset=utf-8")
        elif path in (OPENAI_ROUTE, self._pipeline_path()):
            self._fail("other", ApiError(405, protocol.BAD_INPUT, "use POST"), allow="POST")
        else:
            self._fail("other", ApiError(404, protocol.BAD_INPUT, f"no route {path[:100]!r}"))

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path == OPENAI_ROUTE:
            self._generate("openai")
        elif path == self._pipeline_path():
            self._generate("pipeline")
        else:
            self._drain_or_close()
            self._fail("other", ApiError(404, protocol.BAD_INPUT, f"no route {path[:100]!r}; "
                                         f"use {OPENAI_ROUTE} or {self._pipeline_path()}"))

    def do_PUT(self):
        self._drain_or_close()
        self._fail("other", ApiError(405, protocol.BAD_INPUT, "method not allowed"), allow="GET, POST")

    do_DELETE = do_PATCH = do_PUT

    def _pipeline_path(self) -> str:
        return f"/{self.server.config.service_name}/prediction"

    # --- routes -----------------------------------------------------------------------------------------
    def _status(self):
        model = self.server.model
        body = {
            "status": model.state,
            "error": model.error,
            "service": self.server.config.service_name,
            "routes": [self._pipeline_path(), OPENAI_ROUTE],
            "device": model.device,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.server.started, 1),
            "in_flight": self.server.metrics.in_flight,
            "fixed_latency_ms": self.server.config.fixed_latency_ms,
        }
        if model.engine is not None:
            body["max_prompt_tokens"] = model.engine.tokenizer.max_tokens
            body["native_size"] = model.engine.native_size
        self._send_json(200 if model.state == "ready" else 503, body)

    def _generate(self, route: str):
        started = time.monotonic()
        self.server.metrics.started()
        status, code = 500, protocol.INFERENCE_FAILED
        logid = None
        try:
            if not self._authorized(route, counted=False):
                status, code = 401, protocol.UNAUTHORIZED
                return
            body = self._read_json()
            logid = body.get("logid") if route == "pipeline" else None
            config = self.server.config
            parse = protocol.parse_openai if route == "openai" else protocol.parse_pipeline
            request = parse(body, config.limits, config.default_size)
            reply = self._run_model(route, request, logid)
            self._send_json(200, reply)
            status, code = 200, None
        except ApiError as error:
            status, code = error.http_status, error.code
            self._send_error_body(route, error, logid)
        except Exception as error:  # a bug or an inference crash: a 500 that says so, never a hung socket
            log.exception("inference failed")
            status, code = 500, protocol.INFERENCE_FAILED
            self._send_error_body(route, ApiError(500, code, f"inference failed: {type(error).__name__}"), logid)
        finally:
            self.server.metrics.finished(route, status, time.monotonic() - started, code)

    def _run_model(self, route: str, request: protocol.GenerationRequest, logid) -> dict:
        model = self.server.model
        if model.state == "loading":
            raise ApiError(503, protocol.MODEL_LOADING, "model is still loading; retry shortly")
        if model.state == "failed":
            raise ApiError(503, protocol.MODEL_FAILED, f"model failed to load: {model.error}")
        fault = self.server.take_fault()
        if fault == "unavailable":
            raise ApiError(503, protocol.INJECTED_FAULT, "injected fault: service unavailable")
        if fault == "slow":
            time.sleep(self.server.config.fault_delay_ms / 1000.0)

        engine = model.engine
        tokenized = engine.tokenize(request.prompt)
        try:
            pngs = engine.generate(tokenized, request.seed, request.width, request.height, request.count,
                                   timeout_s=self.server.config.request_timeout_s,
                                   hold_s=self.server.config.fixed_latency_ms / 1000.0)
        except TimeoutError as error:
            raise ApiError(503, protocol.TIMEOUT, f"server busy: {error}") from None
        if fault == "truncate":
            pngs = [png[: len(png) // 2] for png in pngs]
        elif fault == "garbage":
            pngs = [os.urandom(len(png)) for png in pngs]
        self.server.metrics.generated(len(pngs), tokenized.truncated)
        images = [base64.b64encode(png).decode("ascii") for png in pngs]
        if route == "openai":
            return protocol.openai_reply(images, tokenized.used_text, tokenized.truncated, tokenized.total_tokens,
                                         request.seed, request.cleaned, int(time.time()))
        return protocol.pipeline_reply(images, tokenized.used_text, tokenized.truncated, tokenized.total_tokens,
                                       request.seed, request.width, request.height, request.cleaned, logid)

    # --- request reading --------------------------------------------------------------------------------
    def _authorized(self, route: str, counted: bool = True) -> bool:
        token = self.server.token
        if not token:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return True
        self._drain_or_close()
        error = ApiError(401, protocol.UNAUTHORIZED, "missing or wrong bearer token")
        if counted:
            self.server.metrics.started()
            self.server.metrics.finished(route, 401, 0.0, protocol.UNAUTHORIZED)
        self._send_error_body(route, error, None, extra={"WWW-Authenticate": 'Bearer realm="ernie"'})
        return False

    def _read_json(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, protocol.LENGTH_REQUIRED, "chunked bodies are not accepted: send Content-Length")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise ApiError(411, protocol.LENGTH_REQUIRED, "Content-Length is required")
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise ApiError(400, protocol.BAD_INPUT, "Content-Length must be a non-negative integer") from None
        limit = self.server.config.max_body_bytes
        if length > limit:
            self.close_connection = True  # the body is not read, so this connection cannot be reused
            raise ApiError(413, protocol.BODY_TOO_LARGE, f"body of {length} bytes is over the {limit} byte limit")
        raw = self.rfile.read(length)
        if len(raw) < length:
            self.close_connection = True
            raise ApiError(400, protocol.BAD_INPUT, "body ended before Content-Length bytes")
        # Invalid UTF-8 is replaced, not refused: one bad byte in a prompt should not cost the image.
        text = raw.decode("utf-8", errors="replace")
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            raise ApiError(400, protocol.BAD_INPUT, f"body is not valid JSON: {error.msg} at {error.pos}") from None
        except (ValueError, RecursionError) as error:  # a 5000-digit number, nesting 100000 deep
            raise ApiError(400, protocol.BAD_INPUT, f"body is not acceptable JSON: {type(error).__name__}") from None
        if not isinstance(body, dict):
            raise ApiError(400, protocol.BAD_INPUT, "body must be a JSON object")
        return body

    def _drain_or_close(self):
        """Consume a small unread body so the connection stays usable; otherwise close it."""
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if 0 <= length <= 64 * 1024:
            self.rfile.read(length)
        else:
            self.close_connection = True

    # --- replies ------------------------------------------------------------------------------------------
    def _fail(self, route: str, error: ApiError, allow: str | None = None):
        self.server.metrics.started()
        self.server.metrics.finished(route, error.http_status, 0.0, error.http_status)
        self._send_json(error.http_status, protocol.openai_error(error), extra={"Allow": allow} if allow else None)

    def _send_error_body(self, route: str, error: ApiError, logid, extra=None):
        body = protocol.pipeline_error(error, logid) if route == "pipeline" else protocol.openai_error(error)
        headers = dict(extra or {})
        if error.http_status == 503:
            headers["Retry-After"] = "1"
        self._send_json(error.http_status, body, extra=headers)

    def _send_json(self, status: int, body: dict, extra=None):
        self._send(status, json.dumps(body, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8",
                   extra)

    def _send(self, status: int, payload: bytes, content_type: str, extra=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (extra or {}).items():
            if value:
                self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        log.info("%s %s", self.address_string(), format % args)


PARENT_PID_VARIABLE = "DGX_SERVING_PARENT_PID"  # set by dgx_assets.generation.launcher for the servers it starts


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(config: ServingConfig, port_file: str | None = None) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    token = None
    if config.token_env:
        token = os.environ.get(config.token_env)
        if not token:
            log.error("token_env=%s is set but that environment variable is empty", config.token_env)
            return 2
    if config.model_dir is None:
        log.error("no model: pass --model-dir or set op.<service>.local_service_conf.model_config")
        return 2
    if config.host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("listening on %s without a bearer token: anyone who can reach this port can use the GPU",
                    config.host)
    server = ErnieServer(config, token)
    host, port = server.server_address[:2]
    if port_file:
        # Written only once the socket is bound, so a launcher that asked for port 0 reads a live port.
        Path(port_file).write_text(str(port), encoding="utf-8")
    log.info("listening on http://%s:%s (service %s)", host, port, config.service_name)

    stopping = threading.Event()
    listener = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http",
                                daemon=True)
    listener.start()
    # The model loads on the main thread while the listener already answers /status with "loading".
    # Paddle installs its own SIGTERM handler on import, so ours go in after it, from this thread.
    server.model.load()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    launcher = int(os.environ.get(PARENT_PID_VARIABLE) or 0)
    try:
        while not stopping.wait(0.5) and listener.is_alive():
            if launcher and not _alive(launcher):
                # Started for one run or test that has died without stopping us: nobody else will.
                log.warning("launcher pid %s is gone: stopping", launcher)
                break
    finally:
        server.shutdown()
        server.server_close()
    log.info("stopped")
    return 0


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s [ernie-serving pid=%(process)d] %(message)s")
