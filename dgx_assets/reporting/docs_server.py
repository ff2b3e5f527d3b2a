"""A small read-only HTTP server for the pages dgx_assets writes: the quality report, GE's data docs, review queues.

Browsers refuse `file://` links from an http page ("Not allowed to load local resource"), so Dagster's metadata
and the report link here instead. `make dev` starts it beside the Dagster UI (`dgx-assets docs-server`, on
DGX_DOCS_URL, http://127.0.0.1:3001 by default):

    /quality_report/...   <lake>/quality_report/ (report.html), read through the lake's filesystem (file://, hdfs://)
    /data-docs/...        GE's data docs site under the state folder (index.html, one page per validation)
    /review_queue/...     <lake>/review_queue/: each batch's images and saliency pictures, which Label Studio's
                          tasks link to (production/review.py), read as the report is

An ASGI app on uvicorn behind the connection layer the serving process and the station share
(dgx_assets/http_limits.py): at most `max_connections` open, a deadline for each request head, idle keep-alive
connections closed. What it answers:

- GET and HEAD only (405 otherwise), regular files only (no listings, no FIFOs or devices);
- nothing outside the served folders, and no symbolic link inside them either: on a local filesystem each name
  is opened with O_NOFOLLOW from the folder above it, so a link (to /proc/self/environ, to a file beside the
  lake, or one swapped in after a check) is a 404;
- each file streamed in `CHUNK_BYTES` pieces, never read whole: memory stays flat however large the file and
  however slowly it is read;
- a request path never reaches a status line or a header: fixed reason phrases and fixed plain-text bodies;
  a malformed path (invalid UTF-8 such as `%c0%ae`, a control character such as `%00` or `%0d%0a`) is a 400,
  a name longer than any filesystem allows a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mimetypes
import os
import stat
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from starlette.responses import Response

from dgx_assets import http_limits
from dgx_assets.links import DATA_DOCS_ROUTE, REPORT_PAGE, REPORT_ROUTE, REVIEW_QUEUE_ROUTE

FIRST_PAGE = {REPORT_ROUTE: REPORT_PAGE, DATA_DOCS_ROUTE: "index.html"}  # what a folder's address opens
CHUNK_BYTES = 64 * 1024
MAX_NAME_BYTES = 255  # NAME_MAX on Linux filesystems and HDFS's default limit
log = logging.getLogger("dgx_assets.docs_server")


@dataclass(frozen=True)
class DocsLimits:
    """A dev server for one browser: few connections, and short deadlines for idle ones."""

    max_connections: int = 64
    header_timeout_s: float = 5.0  # a connection must send its request head within this
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this


class NotServed(Exception):
    """A request path that names nothing served: `status` 404 (outside, hidden, missing) or 400 (malformed)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def routes() -> dict:
    """Route -> the Lake whose root it serves: the lake's report and review queue folders, GE's data docs site."""
    from dgx_assets import settings
    from dgx_assets.lake.store import Lake
    from dgx_assets.quality.expectations import data_docs_site

    lake = Lake(settings.environment().lake_root)
    return {
        REPORT_ROUTE: Lake(lake.asset_uri(REPORT_ROUTE)),
        REVIEW_QUEUE_ROUTE: Lake(lake.asset_uri(REVIEW_QUEUE_ROUTE)),
        DATA_DOCS_ROUTE: Lake(str(data_docs_site())),
    }


def resolve(raw_path: bytes | str) -> tuple[str, list[str]]:
    """(route, names under it) for a request's raw (still percent-encoded) path; raises NotServed.

    Each name is decoded on its own, so a separator smuggled in percent-encoded stays inside one name (and is
    refused); names are strict UTF-8 without control characters, and none starts with a dot (.., staging
    folders)."""
    raw = raw_path.encode("latin-1") if isinstance(raw_path, str) else raw_path
    raw = raw.partition(b"?")[0]
    names = []
    for segment in raw.split(b"/"):
        decoded = unquote_to_bytes(segment)
        if not decoded:
            continue
        if len(decoded) > MAX_NAME_BYTES:
            raise NotServed(404, "no such page: a name is longer than any file's")
        try:
            name = decoded.decode("utf-8")
        except UnicodeDecodeError:
            raise NotServed(400, "malformed path: not UTF-8") from None
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
            raise NotServed(400, "malformed path: control character")
        if name.startswith(".") or "/" in name or "\\" in name:
            raise NotServed(404, "not one of the served pages")
        names.append(name)
    if not names:
        raise NotServed(404, "not one of the served pages")
    route, rest = names[0], names[1:]
    if raw.endswith(b"/") or not rest:
        rest.append(FIRST_PAGE.get(route, "index.html"))
    return route, rest


def open_local(root: str, names: list[str]) -> int:
    """A descriptor of the regular file `root/names...`, each name opened with O_NOFOLLOW from the folder above
    it: a symbolic link anywhere below `root` (or put there between two checks) is refused. Raises NotServed."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the served folder itself, as configured
    except OSError:
        raise NotServed(404, "no such page") from None
    try:
        for name in names[:-1]:
            try:
                inner = os.open(name, nofollow | os.O_DIRECTORY, dir_fd=folder)
            except OSError:  # missing, a link (ELOOP), not a folder
                raise NotServed(404, "no such page") from None
            os.close(folder)
            folder = inner
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
            fd = os.open(names[-1], nofollow | os.O_NONBLOCK, dir_fd=folder)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.ENXIO, errno.ENAMETOOLONG):
                log.warning("cannot open a docs page: %s", error.strerror)
            raise NotServed(404, "no such page") from None
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, FIFO, socket or device
        os.close(fd)
        raise NotServed(404, "no such page")
    os.set_blocking(fd, True)
    return fd


def _headers(name: str, size: int) -> list[tuple[bytes, bytes]]:
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    content_type = f"{kind}; charset=utf-8" if kind.startswith("text/") else kind
    return [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(size).encode()),
        (b"cache-control", b"no-cache"),  # a re-made report shows on the next reload
        (b"x-content-type-options", b"nosniff"),
    ]


def _plain(status: int, message: str, **headers: str) -> Response:
    """A fixed message, never the request's path (uvicorn writes the status's standard reason phrase)."""
    extra = {"x-content-type-options": "nosniff", "cache-control": "no-cache", **headers}
    return Response(f"{status} {message}\n", status_code=status, media_type="text/plain", headers=extra)


class DocsApp:
    """The ASGI app: `served` maps a route to the Lake whose root it serves."""

    def __init__(self, served: dict):
        self.served = served
        self.app = http_limits.BodyGuard(self._answer, self._finished)

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)

    def _finished(self, scope: dict, status: int, seconds: float) -> None:
        path = scope.get("raw_path", b"").decode("latin-1")[:300]  # escaped by the log's formatter
        log.info("%s %s %s %.0fms", scope.get("method"), path, status, seconds * 1000)

    async def _answer(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            return await _plain(405, "read-only: GET and HEAD only", allow="GET, HEAD")(scope, receive, send)
        raw = scope.get("raw_path") or scope["path"].encode()
        if raw.partition(b"?")[0] in (b"", b"/"):
            location = f"/{REPORT_ROUTE}/{REPORT_PAGE}"
            return await _plain(302, "the report", location=location)(scope, receive, send)
        try:
            route, names = resolve(raw)
            root = self.served.get(route)
            if root is None:
                raise NotServed(404, "not one of the served pages")
            await self._file(root, names, scope, receive, send)
        except NotServed as refused:
            await _plain(refused.status, refused.message)(scope, receive, send)

    async def _file(self, root, names: list[str], scope, receive, send) -> None:
        import pyarrow.fs as pafs

        if isinstance(root.fs, pafs.LocalFileSystem):
            fd = await asyncio.to_thread(open_local, root.fs_path(root.uri()), names)
            with os.fdopen(fd, "rb", buffering=0) as handle:
                await self._stream(names[-1], os.fstat(fd).st_size, handle.read, scope, receive, send)
            return
        # HDFS and other remote stores: no symbolic links to follow, names already checked by `resolve`.
        path = root.fs_path(root.uri(*names))
        info = await asyncio.to_thread(root.fs.get_file_info, path)
        if info.type != pafs.FileType.File:
            raise NotServed(404, "no such page")
        stream = await asyncio.to_thread(root.fs.open_input_stream, path)
        with contextlib.closing(stream):
            await self._stream(names[-1], info.size or 0, stream.read, scope, receive, send)

    @staticmethod
    async def _stream(name: str, size: int, read, scope, receive, send) -> None:
        """The file in CHUNK_BYTES pieces: uvicorn's flow control holds each send until the client has taken
        the last one, so one connection buffers a chunk or two however slowly it reads; a client that leaves
        stops the reading."""
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _headers(name, size)})
            left = 0 if scope["method"] == "HEAD" else size
            while left > 0 and not gone.is_set():
                chunk = await asyncio.to_thread(read, min(CHUNK_BYTES, left))
                if not chunk:  # the file shrank while it was read: the connection is closed short
                    return
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
            if size == 0 or scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


def _refusal(status: int, message: str) -> tuple[bytes, dict[str, str]]:
    """The connection layer's own errors (too many connections, a slow or unparseable head)."""
    import json

    return json.dumps({"error": message, "status": status}).encode(), {"x-content-type-options": "nosniff"}


class DocsServer(http_limits.GuardedServer):
    """The docs server bound to its socket (http_limits.GuardedServer)."""

    def __init__(self, host: str, port: int, served: dict, limits: DocsLimits):
        connection = http_limits.ConnectionLimits(limits.max_connections, limits.header_timeout_s)
        super().__init__(
            DocsApp(served),
            http_limits.guarded_protocol(connection, _refusal),
            host,
            port,
            max_connections=limits.max_connections,
            keep_alive_s=limits.keep_alive_s,
            graceful_s=2,
            backlog=128,
        )


def serve(host: str, port: int, served: dict | None = None, limits: DocsLimits | None = None) -> DocsServer:
    """The server, bound and ready (`serve_forever` runs it); `served` defaults to `routes()`."""
    return DocsServer(host, port, served if served is not None else routes(), limits or DocsLimits())
