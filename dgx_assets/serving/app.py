"""The serving process's ASGI app (Starlette): routes, both wire formats, request limits, access log, metrics.

Routes:
  POST /<service>/prediction    Paddle Serving pipeline format (see protocol.py)
  POST /v1/images/generations   OpenAI-compatible, as SGLang serves the real ERNIE-Image
  GET  /status                  {"status": "loading" | "ready" | "failed", ...}; 200 only when ready
  GET  /metrics                 Prometheus text format (prometheus-client)

Every error, including 404, 405 and the limits, is JSON in the route's own format (pipeline errors on the
pipeline route, OpenAI errors elsewhere) with a Paddle error code. A request reaches the model only with
its whole body read within `body_timeout_s`, under `max_body_bytes`, valid, admitted (at most
`concurrency` running and `max_queue` waiting, else 503 + Retry-After) and with its client still
connected when a predictor frees up. Inference runs in a pool of `concurrency` threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import importlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dgx_assets.http_limits import DISCONNECTED, BodyGuard, BodyRefused, Disconnected, read_body
from dgx_assets.serving import protocol
from dgx_assets.serving.config import ServingConfig
from dgx_assets.serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dgx_assets.serving.metrics import Metrics
from dgx_assets.serving.protocol import ApiError

log = logging.getLogger("dgx_assets.serving")
OPENAI_ROUTE = "/v1/images/generations"
JSON_TYPE = "application/json; charset=utf-8"
# The shared body reader's refusals, by HTTP status, as Paddle error codes.
BODY_CODES = {400: protocol.BAD_HTTP, 408: protocol.READ_TIMEOUT, 411: protocol.LENGTH_REQUIRED, 413: protocol.BODY_TOO_LARGE}


class ModelHolder:
    """Loads the engine (in the background) and tells /status how far it got."""

    def __init__(self, config: ServingConfig, factory=None):
        self.config = config
        self.factory = factory
        self.state = "loading"
        self.error = ""
        self.engine = None
        self.device = ""

    def load(self) -> None:
        try:
            factory = self.factory or import_engine(self.config.engine)
            engine = factory(self.config)
            self.engine, self.device = engine, engine.device.kind
            if engine.device.note:
                log.warning(engine.device.note)
            self.state = "ready"
            log.info("model ready on %s from %s (engine %s)", self.device, self.config.model_dir, self.config.engine)
        except Exception as error:  # any failure is reported on /status; the process stays up
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
            log.error("model failed to load: %s", self.error)


def import_engine(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


class ServingApp:
    """The ASGI callable: a guard around a Starlette app (metrics, access log, closing connections whose
    body was left unread), with the generation logic and its bounded inference pool."""

    def __init__(self, config: ServingConfig, token: str | None, model: ModelHolder, metrics: Metrics):
        self.config, self.token, self.model, self.metrics = config, token, model, metrics
        self.pipeline_path = f"/{config.service_name}/prediction"
        self.pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="inference")
        self.slots = asyncio.Semaphore(config.concurrency)  # one per inference thread
        self.admitted = 0  # generation requests running or waiting for a slot
        self.started = time.time()
        metrics.model_ready.set_function(lambda: int(model.state == "ready"))
        self.app = Starlette(
            routes=[
                Route("/status", self.status, methods=["GET"]),
                Route("/metrics", self.metrics_page, methods=["GET"]),
                Route(OPENAI_ROUTE, self.openai, methods=["POST"]),
                Route(self.pipeline_path, self.pipeline, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self.http_error, Exception: self.crash},  # pyright: ignore[reportArgumentType]
        )
        self.app.router.redirect_slashes = False  # a 307 to "/status" would be the one reply that is not JSON
        self.guard = BodyGuard(self.app, self.finished)  # closes connections whose body was left unread

    # --- the guard ------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})
        self.metrics.in_flight.inc()
        try:
            await self.guard(scope, receive, send)
        finally:
            self.metrics.in_flight.dec()

    def finished(self, scope: dict, status: int, seconds: float) -> None:
        code = scope["state"].get("error_code")
        self.metrics.finished(self.route_label(scope["path"]), status, seconds, code)
        # The path without its query string (tokens and other secrets travel there), cut short; the log
        # formatter escapes control characters.
        client = scope.get("client") or ("-", 0)
        log.info(
            '%s "%s %s" %s%s %.1f ms',
            client[0],
            scope["method"],
            scope["path"][:200],
            status,
            f" err {code}" if code else "",
            seconds * 1000,
        )

    def route_label(self, path: str) -> str:
        return {OPENAI_ROUTE: "openai", self.pipeline_path: "pipeline", "/status": "status", "/metrics": "metrics"}.get(
            path, "other"
        )

    # --- plain routes -----------------------------------------------------------------------------------
    async def status(self, request: Request) -> Response:
        model = self.model
        body = {
            "status": model.state,
            "error": model.error,
            "service": self.config.service_name,
            "routes": [self.pipeline_path, OPENAI_ROUTE],
            "device": model.device,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 1),
            "in_flight": self.admitted,
            "engine": self.config.engine,
            "tls": bool(self.config.tls_cert),
        }
        if model.engine is not None:
            body["max_prompt_tokens"] = model.engine.tokenizer.max_tokens
            body["native_size"] = model.engine.native_size
        return json_response(200 if model.state == "ready" else 503, body)

    async def metrics_page(self, request: Request) -> Response:
        try:
            self.check_token(request)
        except ApiError as error:
            return self.error_response(request, error)
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        path = request.url.path
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            error = ApiError(
                405,
                protocol.METHOD_NOT_ALLOWED,
                f"method {request.method} is not allowed on {path[:100]!r}; use {allow}",
                headers={"Allow": allow},
            )
        elif exc.status_code == 404:
            error = ApiError(404, protocol.NOT_FOUND, f"no route {path[:100]!r}; use {OPENAI_ROUTE} or {self.pipeline_path}")
        else:
            error = ApiError(exc.status_code, protocol.BAD_INPUT, str(exc.detail))
        return self.error_response(request, error)

    async def crash(self, request: Request, exc: Exception) -> Response:
        """A bug outside the generation routes (those catch their own): still JSON, with a code."""
        return self.error_response(request, ApiError(500, protocol.INFERENCE_FAILED, f"internal error: {type(exc).__name__}"))

    # --- generation ---------------------------------------------------------------------------------------
    async def openai(self, request: Request) -> Response:
        return await self.generate(request, "openai")

    async def pipeline(self, request: Request) -> Response:
        return await self.generate(request, "pipeline")

    async def generate(self, request: Request, route: str) -> Response:
        logid = None
        try:
            self.check_token(request)
            body = await self.read_json(request)
            logid = body.get("logid") if route == "pipeline" else None
            parse = protocol.parse_openai if route == "openai" else protocol.parse_pipeline
            parsed = parse(body, self.config.limits, self.config.default_size)
            if self.model.state == "loading":
                raise ApiError(503, protocol.MODEL_LOADING, "model is still loading; retry shortly")
            if self.model.state == "failed":
                raise ApiError(503, protocol.MODEL_FAILED, f"model failed to load: {self.model.error}")
            payload = await self.run_model(request, route, parsed, logid)
            return Response(payload, media_type=JSON_TYPE)
        except ApiError as error:
            return self.error_response(request, error, logid)
        except Disconnected:
            return Response(status_code=DISCONNECTED)  # nobody to send it to; recorded as such
        except Exception as error:  # a bug or an inference crash: a 500 that says so, never a hung socket
            log.exception("inference failed")
            failed = ApiError(500, protocol.INFERENCE_FAILED, f"inference failed: {type(error).__name__}")
            return self.error_response(request, failed, logid)

    def check_token(self, request: Request) -> None:
        if not self.token:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return
        raise ApiError(
            401, protocol.UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="ernie"'}
        )

    async def read_json(self, request: Request) -> dict:
        """The body as a JSON object, read by the shared bounded reader (limit, whole-body deadline)."""
        try:
            raw = await read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)
        except BodyRefused as refused:
            raise ApiError(refused.status, BODY_CODES[refused.status], refused.message) from None
        # Invalid UTF-8 is replaced, not refused: one bad byte in a prompt should not cost the image.
        text = bytes(raw).decode("utf-8", errors="replace")
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            raise ApiError(400, protocol.BAD_INPUT, f"body is not valid JSON: {error.msg} at {error.pos}") from None
        except (ValueError, RecursionError) as error:  # a 5000-digit number, nesting 5000 deep
            raise ApiError(400, protocol.BAD_INPUT, f"body is not acceptable JSON: {type(error).__name__}") from None
        if not isinstance(body, dict):
            raise ApiError(400, protocol.BAD_INPUT, "body must be a JSON object")
        return body

    async def run_model(self, request: Request, route: str, parsed: protocol.GenerationRequest, logid) -> bytes:
        config = self.config
        if self.admitted >= config.concurrency + config.max_queue:
            raise ApiError(503, protocol.QUEUE_FULL, f"server full: {self.admitted} requests running or waiting; retry later")
        self.admitted += 1
        submitted = False
        try:
            await self.wait_for_slot(request)
            loop = asyncio.get_running_loop()
            try:
                job = self.pool.submit(self.infer, route, parsed, logid)
            except BaseException:
                self.slots.release()
                raise
            submitted = True
            # The slot is freed when the thread is, even if this request is cancelled meanwhile.
            job.add_done_callback(lambda _: _call_soon(loop, self._release))
            return await asyncio.wrap_future(job)
        finally:
            if not submitted:
                self.admitted -= 1

    def _release(self) -> None:
        self.admitted -= 1
        self.slots.release()

    async def wait_for_slot(self, request: Request) -> None:
        """A free inference slot, or 503 after request_timeout_s, or Disconnected if the client leaves first."""
        acquire = asyncio.ensure_future(self.slots.acquire())
        gone = asyncio.ensure_future(_disconnect(request))
        self.metrics.queued.inc()
        try:
            await asyncio.wait({acquire, gone}, timeout=self.config.request_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.metrics.queued.dec()
            gone.cancel()
            if not acquire.done():
                acquire.cancel()
        got = acquire.done() and not acquire.cancelled()
        if gone.done() and not gone.cancelled():
            if got:
                self.slots.release()
            raise Disconnected
        if not got:
            raise ApiError(503, protocol.TIMEOUT, f"server busy: no free predictor within {self.config.request_timeout_s:g}s")

    def infer(self, route: str, parsed: protocol.GenerationRequest, logid) -> bytes:
        """On an inference thread: tokens, images, the reply's JSON bytes (so the event loop only sends)."""
        from dgx_assets.serving.engine import EngineUnavailable

        engine = self.model.engine
        assert engine is not None  # requests reach the pool only once the model is ready
        tokenized = engine.tokenize(parsed.prompt)
        try:
            pngs = engine.generate(tokenized, parsed.seed, parsed.width, parsed.height, parsed.count)
        except EngineUnavailable as error:
            raise ApiError(503, protocol.ENGINE_UNAVAILABLE, f"engine unavailable: {error}") from None
        except TimeoutError as error:
            raise ApiError(503, protocol.TIMEOUT, f"server busy: {error}") from None
        self.metrics.generated(len(pngs), tokenized.truncated)
        images = [base64.b64encode(png).decode("ascii") for png in pngs]
        if route == "openai":
            reply = protocol.openai_reply(
                images,
                tokenized.used_text,
                tokenized.truncated,
                tokenized.total_tokens,
                parsed.seed,
                parsed.cleaned,
                int(time.time()),
            )
        else:
            reply = protocol.pipeline_reply(
                images,
                tokenized.used_text,
                tokenized.truncated,
                tokenized.total_tokens,
                parsed.seed,
                parsed.width,
                parsed.height,
                parsed.cleaned,
                logid,
            )
        return json.dumps(reply, ensure_ascii=False).encode("utf-8")

    # --- replies ------------------------------------------------------------------------------------------
    def error_response(self, request: Request, error: ApiError, logid=None) -> Response:
        request.scope["state"]["error_code"] = error.code
        if request.url.path == self.pipeline_path:
            body = protocol.pipeline_error(error, logid)
        else:
            body = protocol.openai_error(error)
        return json_response(error.http_status, body, error.headers)


def _call_soon(loop, callback) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop has closed: the server is gone, and its slots with it
        pass


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (the body is read, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def json_response(status: int, body: dict, headers: dict | None = None) -> Response:
    return Response(
        json.dumps(body, ensure_ascii=False).encode("utf-8"), status_code=status, headers=headers, media_type=JSON_TYPE
    )
