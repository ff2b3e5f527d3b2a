"""The HTTP limits the serving process and the edge runtime share: ASGI apps on uvicorn's h11 protocol.

Light on purpose (uvicorn, h11, starlette and the standard library; never paddle), so the edge install
runs the same code as the serving process:

- ``guarded_protocol``: at most ``max_connections`` open connections, those still in their TLS handshake
  included; a deadline for the handshake and one for each request head (slow loris); JSON for the
  protocol layer's own errors, such as unparseable HTTP (h11 refuses two different Content-Length values
  and non-ASCII ones);
- ``read_body``: a body refused from its Content-Length before anything is buffered, cut off past the
  limit, and given one deadline for the whole body, not one per read; ``on_chunk`` sees each chunk's size
  as it arrives, so a memory budget counts the bytes read, not the ones declared;
- ``refuse_ambiguous_framing``: Content-Length and Transfer-Encoding together refused (RFC 9112 6.3);
- ``BodyGuard``: closes a connection whose reply went out before its body was read, and reports each
  request's status and time;
- ``GuardedServer``: such an app bound to its socket, run until a signal or ``shutdown()``;
- ``EscapingFormatter``: control characters never reach a log line raw.
"""

from __future__ import annotations

import asyncio
import http
import logging
import resource
import socket
import ssl
import sys
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

import h11
import uvicorn
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

DISCONNECTED = 499  # recorded for requests whose client left before the reply (nginx's convention)
# uvloop starts reading a connection right after connection_made(), so a ClientHello can reach this
# protocol before start_tls() takes the connection over (1 handshake in 10 stalled, measured); asyncio's
# loop does not. The edge install has no uvloop: both processes run the same loop.
EVENT_LOOP = "asyncio"
log = logging.getLogger("dgx_assets.http")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    handshake_timeout_s: float = 10.0


class BodyRefused(Exception):
    """The request body cannot be read: `status` is the HTTP status to answer (400, 408, 411, 413)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Disconnected(Exception):
    """The client closed its connection; nothing more is done for it."""


def _ignore(*_: Any) -> None:
    pass


# Reply(status, message) -> (JSON body, extra headers): each process answers in its own error format.
Reply = Callable[[int, str], tuple[bytes, dict[str, str]]]


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits above; `guarded_protocol` makes one with its settings. TLS (if
    given) is done here, so a handshake is counted and timed from the first byte."""

    limits: ConnectionLimits
    tls: ssl.SSLContext | None = None
    opened: list[int]  # connections of this server, handshaking ones included
    header_timer = handshake = None
    counted = established = False
    early = b""  # what the TLS layer hands over between the handshake and start_tls returning

    def connection_made(self, transport):
        self.counted = True
        self.opened[0] += 1
        self.on_connections(self.opened[0])
        if self.opened[0] > self.limits.max_connections:
            self.on_refused("max_connections")
            if self.tls is not None:  # no way to say why before a handshake: closed at once
                transport.abort()
                return
            self._established(transport)
            self._refuse(503, "too many open connections; retry later")
        elif self.tls is not None:
            transport.pause_reading()  # the ClientHello is for start_tls's protocol, not this one
            self.handshake = self.loop.create_task(self._handshake(transport, self.tls))  # held: the loop keeps weak refs
        else:
            self._established(transport)

    async def _handshake(self, raw, tls: ssl.SSLContext) -> None:
        started = self.loop.time()
        try:
            secure = await self.loop.start_tls(
                raw, self, tls, server_side=True, ssl_handshake_timeout=self.limits.handshake_timeout_s
            )
        except asyncio.CancelledError:  # the server is stopping
            self._uncount()
            raise
        except Exception as error:  # too slow, not TLS, gone: start_tls has closed the connection
            too_slow = self.loop.time() - started >= self.limits.handshake_timeout_s * 0.99
            self.on_refused("handshake_timeout" if too_slow else "handshake_failed")
            log.debug("TLS handshake failed: %s", error)
            self._uncount()
            return
        self._established(secure)

    def _established(self, transport) -> None:
        self.established = True
        super().connection_made(transport)
        self._arm_header_timer()
        if self.early:
            early, self.early = self.early, b""
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if not self.established:  # one loop turn at most: until start_tls returns
            self.early += data
            return
        # A new request starts with its first byte; its head must be complete within header_timeout_s.
        if self.header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()

    def connection_lost(self, exc):
        self._uncount()
        self._cancel_header_timer()
        if self.established:
            super().connection_lost(exc)

    def _uncount(self) -> None:
        if self.counted:
            self.counted = False
            self.opened[0] -= 1
            self.on_connections(self.opened[0])

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "invalid HTTP request")

    def _arm_header_timer(self) -> None:
        self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timed_out(self) -> None:
        self.header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.on_refused("header_timeout")
            self._refuse(408, f"request head not received within {self.limits.header_timeout_s:g}s")

    def _refuse(self, status: int, message: str) -> None:
        """A JSON error written straight to the socket (there may be no request to answer), then close."""
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        body, headers = self.reply(status, message)
        head = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            *(f"{name.lower()}: {value}" for name, value in headers.items()),
        ]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.transport.close()

    # Set per server by guarded_protocol.
    def reply(self, status: int, message: str) -> tuple[bytes, dict[str, str]]:
        raise NotImplementedError

    def on_refused(self, reason: str) -> None:
        pass

    def on_connections(self, count: int) -> None:
        pass


def guarded_protocol(
    limits: ConnectionLimits,
    reply: Reply,
    on_refused: Callable[[str], None] = _ignore,
    on_connections: Callable[[int], None] = _ignore,
    tls: ssl.SSLContext | None = None,
) -> type[GuardedH11Protocol]:
    """The guarded protocol class for one server: its limits, its error format (`reply`), `on_refused(reason)`
    for each connection closed on a limit, `on_connections(count)` when the count of open ones changes."""
    settings = {
        "limits": limits,
        "tls": tls,
        "opened": [0],
        "reply": staticmethod(reply),
        "on_refused": staticmethod(on_refused),
        "on_connections": staticmethod(on_connections),
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), settings)


def declared_length(request: Request, max_bytes: int, chunked: bool = True) -> int | None:
    """The body's Content-Length (None for a chunked body), refused when absent, ambiguous or over `max_bytes`."""
    lengths = request.headers.getlist("content-length")
    if len(set(lengths)) > 1 or not all(text.isascii() and text.isdigit() for text in lengths):
        raise BodyRefused(400, "Content-Length must be one number in ASCII digits")
    if not lengths and not (chunked and "chunked" in request.headers.get("transfer-encoding", "").lower()):
        raise BodyRefused(411, "send Content-Length" + (" (or a chunked body)" if chunked else ""))
    if lengths and (len(lengths[0]) > 15 or int(lengths[0]) > max_bytes):
        raise BodyRefused(413, f"body of {lengths[0][:20]} bytes is over the {max_bytes} byte limit")
    return int(lengths[0]) if lengths else None


def refuse_ambiguous_framing(request: Request) -> None:
    """400 for a request with both Content-Length and Transfer-Encoding: h11 reads the chunked body and a
    budget taken from Content-Length would count the wrong size (RFC 9112 section 6.3 allows refusing it)."""
    if request.headers.getlist("content-length") and request.headers.getlist("transfer-encoding"):
        raise BodyRefused(400, "send Content-Length or Transfer-Encoding, not both (RFC 9112 section 6.3)")


async def read_body(
    request: Request,
    max_bytes: int,
    timeout_s: float,
    chunked: bool = True,
    on_chunk: Callable[[int], None] | None = None,
) -> bytes:
    """The whole body: refused from Content-Length alone when over the limit, cut off when a chunked body
    passes it, and given up (408) when all of it has not arrived `timeout_s` after the head. `on_chunk(n)`
    is called with each chunk's size before it is kept (it may raise BodyRefused to stop reading)."""
    declared_length(request, max_bytes, chunked)
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if on_chunk is not None:
                    on_chunk(len(chunk))
                raw += chunk
                if len(raw) > max_bytes:
                    raise BodyRefused(413, f"body is over the {max_bytes} byte limit")
    except TimeoutError:
        raise BodyRefused(408, f"body not received within {timeout_s:g}s") from None
    except ClientDisconnect:
        raise Disconnected from None
    return bytes(raw)


class BodyGuard:
    """An ASGI wrapper: a reply that starts before the request body was read carries `connection: close`
    (the rest of the body must not be read as the next request), and `done(scope, status, seconds)` is
    called when each request ends (status DISCONNECTED if no reply went out)."""

    def __init__(self, app: Callable[..., Awaitable[None]], done: Callable[[dict, int, float], None]):
        self.app, self.done = app, done

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return await self.app(scope, receive, send)
        started = time.monotonic()
        headers = dict(scope["headers"])
        seen = {
            "body_done": headers.get(b"content-length", b"0").strip() == b"0" and b"transfer-encoding" not in headers,
            "status": DISCONNECTED,
        }

        async def guarded_receive():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                seen["body_done"] = True
            return message

        async def guarded_send(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                if not seen["body_done"]:
                    message = dict(message, headers=[*message.get("headers", []), (b"connection", b"close")])
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            self.done(scope, seen["status"], time.monotonic() - started)


def uvicorn_config(app, protocol: type[H11Protocol], keep_alive_s: float, graceful_s: float) -> uvicorn.Config:
    """uvicorn for a guarded app: our protocol class (uvicorn's documented `http=` extension point), asyncio's
    loop, no lifespan, no access log of uvicorn's own (it writes query strings), no server or proxy headers."""
    return uvicorn.Config(
        app,
        http=protocol,
        loop=EVENT_LOOP,
        lifespan="off",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        # uvicorn annotates these int, but takes any number of seconds
        timeout_keep_alive=keep_alive_s,  # pyright: ignore[reportArgumentType]
        timeout_graceful_shutdown=graceful_s,  # pyright: ignore[reportArgumentType]
    )


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with TLS 1.2 as the minimum; raises OSError / ssl.SSLError for a bad file."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off only on sockets that say so, and a reply's two writes
    # otherwise wait out the client's delayed ACK (+50 ms a request, bench/serving.py).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def raise_open_file_limit(wanted: int) -> None:
    """Each connection is a file descriptor: make room for `wanted` if the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning("open file limit %s is below %s: connections past it are refused by the kernel, not answered", soft, wanted)


class GuardedServer:
    """A guarded app bound and ready: `server_address` holds (host, port); `serve_forever()` runs until SIGINT or
    SIGTERM (on the main thread) or `shutdown()`; a context manager that closes the socket."""

    def __init__(
        self,
        app,
        protocol: type[H11Protocol],
        host: str,
        port: int,
        *,
        max_connections: int,
        keep_alive_s: float,
        graceful_s: float,
        backlog: int,
    ):
        raise_open_file_limit(max_connections + 64)
        self.socket = listen(host, port, backlog=backlog)
        self.server_address = self.socket.getsockname()[:2]
        self.uvicorn = uvicorn.Server(uvicorn_config(app, protocol, keep_alive_s, graceful_s))

    def serve_forever(self) -> None:
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.close()

    def shutdown(self) -> None:
        self.uvicorn.should_exit = True

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


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


def configure_logging(tag: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(f"%(asctime)s %(levelname)s [{tag} pid=%(process)d] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
