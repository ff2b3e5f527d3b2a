"""A small read-only HTTP server for the pages dgx_assets writes: the quality report and GE's data docs.

Browsers refuse `file://` links from an http page ("Not allowed to load local resource"), so Dagster's metadata
and the report link here instead. `make dev` starts it beside the Dagster UI (`dgx-assets docs-server`, on
DGX_DOCS_URL, http://127.0.0.1:3001 by default):

    /quality_report/...   <lake>/quality_report/ (report.html), read through the lake's filesystem (file://, hdfs://)
    /data-docs/...        GE's data docs site under the state folder (index.html, one page per validation)

GET and HEAD only (anything else is 501), files only (no listings), nothing outside those two folders.
"""

from __future__ import annotations

import http.server
import mimetypes
import posixpath
from urllib.parse import unquote, urlsplit

from dgx_assets.links import DATA_DOCS_ROUTE, REPORT_PAGE, REPORT_ROUTE

FIRST_PAGE = {REPORT_ROUTE: REPORT_PAGE, DATA_DOCS_ROUTE: "index.html"}  # what a folder's address opens


def routes() -> dict:
    """Route -> the Lake whose root it serves: the lake's report folder and GE's data docs site."""
    from dgx_assets import settings
    from dgx_assets.lake.store import Lake
    from dgx_assets.quality.expectations import data_docs_site

    lake = Lake(settings.environment().lake_root)
    return {REPORT_ROUTE: Lake(lake.asset_uri(REPORT_ROUTE)), DATA_DOCS_ROUTE: Lake(str(data_docs_site()))}


def resolve(path: str) -> tuple[str, list[str]] | None:
    """(route, path parts under it) for a request path, or None for one outside the served folders."""
    parts = [unquote(part) for part in urlsplit(path).path.split("/")]
    parts = [part for part in parts if part]
    # No dot entries (.., staging folders) and no separator smuggled in percent-encoded: nothing outside the route.
    if not parts or any(part.startswith(".") or "/" in part or "\\" in part for part in parts):
        return None
    route, rest = parts[0], parts[1:]
    if urlsplit(path).path.endswith("/") or not rest:
        rest.append(FIRST_PAGE.get(route, "index.html"))
    return route, rest


class DocsHandler(http.server.BaseHTTPRequestHandler):
    served: dict = {}  # route -> Lake, set by `serve`
    server_version = "dgx-assets-docs"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if urlsplit(self.path).path in ("", "/"):
            self.send_response(302)
            self.send_header("Location", f"/{REPORT_ROUTE}/{REPORT_PAGE}")
            self.end_headers()
            return
        found = resolve(self.path)
        root = self.served.get(found[0]) if found else None
        if found is None or root is None:
            return self.send_error(404, "not one of the served pages")
        import pyarrow.fs as pafs

        path = root.fs_path(root.uri(*found[1]))
        if root.fs.get_file_info(path).type != pafs.FileType.File:
            return self.send_error(404, f"no {'/'.join(found[1])} under /{found[0]}/")
        with root.fs.open_input_stream(path) as stream:
            data = stream.read()
        kind = mimetypes.guess_type(posixpath.basename(path))[0] or "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", f"{kind}; charset=utf-8" if kind.startswith("text/") else kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")  # a re-made report shows on the next reload
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if body:
            self.wfile.write(data)


def serve(host: str, port: int, served: dict | None = None) -> http.server.ThreadingHTTPServer:
    """The server, bound and ready (`serve_forever` runs it); `served` defaults to `routes()`."""
    handler = type("Handler", (DocsHandler,), {"served": served if served is not None else routes()})
    return http.server.ThreadingHTTPServer((host, port), handler)
