"""The edge runtime over HTTP: an ASGI app on uvicorn, with the limits the serving process uses.

Routes: ``POST /v1/classify`` (the image file's bytes as the body) and ``GET /healthz`` (the model, its
input, where it came from, and the process's peak memory). Every reply is JSON, errors included.

The connection layer and the body reader are shared with the serving process (dgx_assets/http_limits.py):
a connection cap, a deadline for each request head and one for each whole body (not per read, so a
client that drips a byte at a time is cut off), duplicate or non-ASCII Content-Length refused with a JSON
400, control characters escaped in the log. Here besides:

- a request with both Content-Length and Transfer-Encoding is refused 400 (RFC 9112 section 6.3);
- bodies held in memory at once are bounded, at most ``max_in_flight`` bodies of ``max_body_bytes``: a
  request whose declared length does not fit is answered 503 before its body is read, and the bytes
  actually read are counted as they arrive (503 past the budget), whatever was declared;
- at most ``max_in_flight`` requests wait for or run a classification (503 past it), and one image is
  decoded and classified at a time, off the event loop, so memory holds one decode at a time;
- a format outside the station's (runtime.py, from the magic bytes): 415; the pixel budget refuses an
  oversized image from its header, and the scan budget a JPEG of too many scans: 413; undecodable bytes,
  or a decode past its deadline: 422.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dgx_assets import http_limits
from dgx_assets.station.runtime import (
    DEFAULT_MAX_BODY_BYTES,
    DecodeDeadline,
    EdgeClassifier,
    EdgeRuntimeError,
    ImageTooLarge,
    UnreadableImage,
    UnsupportedFormat,
)

log = logging.getLogger("dgx_assets.edge")
ROUTES = "use GET /healthz or POST /v1/classify"


@dataclass(frozen=True)
class EdgeServerLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_in_flight: int = 4  # requests past their body, classified or waiting; also bounds the bodies held
    socket_timeout_s: float = 10.0  # to send a request head, and again to send its whole body
    max_connections: int = 64
    keep_alive_s: float = 5.0


def peak_rss_bytes() -> int:
    """The most memory this process has held resident: VmHWM (ru_maxrss would count the parent's before exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes where /proc is missing


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": message, "status": status}).encode()


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(json.dumps(body).encode(), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    return Response(error_body(status, message), status_code=status, headers=headers, media_type="application/json")


class EdgeApp:
    """The ASGI callable: routes, the body budget and the classification worker."""

    def __init__(self, classifier: EdgeClassifier, limits: EdgeServerLimits):
        self.classifier, self.limits = classifier, limits
        self.budget = limits.max_in_flight * limits.max_body_bytes  # body bytes held at once
        self.buffered = 0
        self.admitted = 0
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="classify")  # one decode in memory at a time
        app = Starlette(
            routes=[Route("/healthz", self.health, methods=["GET"]), Route("/v1/classify", self.classify, methods=["POST"])],
            exception_handlers={HTTPException: self.http_error, Exception: self.crash},  # pyright: ignore[reportArgumentType]
        )
        app.router.redirect_slashes = False
        self.app = http_limits.BodyGuard(app, self.finished)

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)

    def finished(self, scope: dict, status: int, seconds: float) -> None:
        client = scope.get("client") or ("-", 0)
        # The path without its query, cut short; the formatter escapes control characters.
        log.info('%s "%s %s" %s %.1f ms', client[0], scope["method"], scope["path"][:200], status, seconds * 1000)

    async def health(self, request: Request) -> Response:
        c = self.classifier
        return _json(
            200,
            {
                "status": "ok",
                "class_names": c.class_names,
                "format": c.format,
                "decision": c.decision_rule,
                "contract": c.contract_source,
                "input": [c.raw_height, c.raw_width, c.channels],
                "source": c.source,
                "max_pixels": c.max_pixels,
                "peak_rss_bytes": peak_rss_bytes(),
            },
        )

    async def classify(self, request: Request) -> Response:
        limits = self.limits
        try:
            http_limits.refuse_ambiguous_framing(request)
            length = http_limits.declared_length(request, limits.max_body_bytes, chunked=False) or 0
        except http_limits.BodyRefused as refused:
            return _error(refused.status, refused.message)
        if self.buffered + length > self.budget:
            return _error(503, f"busy: {self.buffered} body bytes already held, retry")
        self.buffered += length
        held, read = [length], [0]  # bytes counted against the budget for this request; bytes read so far

        def count(size: int) -> None:  # the declared length is reserved; what is read past it is counted too
            read[0] += size
            more = read[0] - held[0]
            if more > 0:
                if self.buffered + more > self.budget:
                    raise http_limits.BodyRefused(503, f"busy: {self.buffered} body bytes already held, retry")
                self.buffered += more
                held[0] += more

        try:
            content = await http_limits.read_body(
                request, limits.max_body_bytes, limits.socket_timeout_s, chunked=False, on_chunk=count
            )
            if self.admitted >= limits.max_in_flight:
                return _error(503, "busy: too many requests in flight, retry")
            self.admitted += 1
            try:
                result = await asyncio.wrap_future(self.worker.submit(self.classifier.classify, content))
            finally:
                self.admitted -= 1
        except http_limits.BodyRefused as refused:
            return _error(refused.status, refused.message)
        except http_limits.Disconnected:
            return Response(status_code=http_limits.DISCONNECTED)
        except UnsupportedFormat as error:
            return _error(415, str(error))
        except ImageTooLarge as error:
            return _error(413, str(error))
        except (UnreadableImage, DecodeDeadline) as error:
            return _error(422, str(error))
        except EdgeRuntimeError as error:
            return _error(400, str(error))
        finally:
            self.buffered -= held[0]
        return _json(200, result.to_dict())

    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        status = exc.status_code
        if status in (404, 405):
            return _error(404, f"no route {request.method} {request.url.path[:100]}: {ROUTES}")
        return _error(status, str(exc.detail))

    async def crash(self, request: Request, exc: Exception) -> Response:
        log.exception("classification failed")
        return _error(500, f"internal error: {type(exc).__name__}")


class EdgeServer(http_limits.GuardedServer):
    """The station's server bound to its socket (http_limits.GuardedServer; port 0 picks one)."""

    def __init__(self, classifier: EdgeClassifier, host: str, port: int, limits: EdgeServerLimits):
        self.app = EdgeApp(classifier, limits)
        connection = http_limits.ConnectionLimits(limits.max_connections, limits.socket_timeout_s)
        super().__init__(
            self.app,
            http_limits.guarded_protocol(connection, lambda status, message: (error_body(status, message), {})),
            host,
            port,
            max_connections=limits.max_connections,
            keep_alive_s=limits.keep_alive_s,
            graceful_s=5,
            backlog=256,
        )

    def close(self) -> None:
        super().close()
        self.app.worker.shutdown(wait=False, cancel_futures=True)


def make_server(classifier: EdgeClassifier, host: str = "127.0.0.1", port: int = 8500, **limits: Any) -> EdgeServer:
    """A bound server with the given EdgeServerLimits fields; call serve_forever()."""
    return EdgeServer(classifier, host, port, EdgeServerLimits(**limits))
