"""A small ERNIE-Image endpoint of the tests' own that misbehaves on purpose, on 127.0.0.1 (http or https).

Both wire formats. Each image request takes the next scripted answer from `script` (a list the test fills),
or, when it is empty, `always`, or, when that is None, answers properly with a PNG of the size asked for.
Answers:

- `("json", obj)`: HTTP 200 with `obj` as JSON (wrong types, missing fields ...)
- `("drip", interval_s)`: a proper reply, sent one byte every `interval_s` seconds, headers included
- `("raw", status, body_bytes)`: exactly that; `("raw", status, body_bytes, "close")` closes the connection after it

`/status` answers ready, or drips when `drip_status` is set. Dripping stops when the client hangs up or after
`DRIP_LIMIT_S`, and `stop()` ends the server, so nothing outlives the test.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

DRIP_LIMIT_S = 30.0


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 90).save(buffer, format="PNG")
    return buffer.getvalue()


class RogueServer:
    def __init__(self, ssl_context=None):
        self.script: list[tuple] = []
        self.always: tuple | None = None  # the answer once `script` is used up; None: a proper one
        self.drip_status: float | None = None
        self.requests = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        handler = type("Handler", (_Handler,), {"rogue": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        scheme = "http"
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def next_answer(self):
        with self._lock:
            self.requests += 1
            return self.script.pop(0) if self.script else self.always

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    rogue: RogueServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        body = json.dumps({"status": "ready"}).encode()
        if self.rogue.drip_status is not None:
            self._drip(200, body, self.rogue.drip_status)
        else:
            self._send(200, body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        pipeline = self.path.endswith("/prediction")
        if pipeline:
            fields = dict(zip(request["key"], request["value"]))
            width, height, prompt = int(fields["width"]), int(fields["height"]), fields["prompt"]
        else:
            width, height = (int(x) for x in request["size"].split("x"))
            prompt = request["prompt"]
        image = base64.b64encode(png(width, height)).decode()
        if pipeline:
            good = {"err_no": 0, "err_msg": "", "key": ["image", "truncated", "used_prompt"], "value": [image, "false", prompt]}
        else:
            good = {"created": 0, "data": [{"b64_json": image, "revised_prompt": prompt}], "truncated": False}
        answer = self.rogue.next_answer()
        if answer is None:
            self._send(200, json.dumps(good).encode())
        elif answer[0] == "json":
            self._send(200, json.dumps(answer[1]).encode())
        elif answer[0] == "drip":
            self._drip(200, json.dumps(good).encode(), answer[1])
        else:
            self._send(answer[1], answer[2], close=answer[3:] == ("close",))

    def _send(self, status: int, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, status: int, body: bytes, interval_s: float) -> None:
        head = (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        ends = time.monotonic() + DRIP_LIMIT_S
        try:
            for index in range(len(head + body)):
                if self.rogue._stopped.is_set() or time.monotonic() > ends:
                    break
                self.wfile.write((head + body)[index : index + 1])
                self.wfile.flush()
                time.sleep(interval_s)
        except OSError:  # the client hung up: what a deadline does
            pass
        self.close_connection = True
