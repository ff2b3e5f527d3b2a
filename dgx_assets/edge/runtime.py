"""The edge runtime: the champion's TFLite model run with LiteRT on an inspection station.

It needs numpy, Pillow and ai-edge-litert, nothing else of the platform (no TensorFlow, Spark or MLflow):
``fetch_edge_model`` (MLflow) runs once in the pod's init container, ``EdgeClassifier`` and the HTTP server
run in the small edge container. A model folder is what edge_model logs to its MLflow run: ``model.tflite``
and ``edge_model.json`` (the contract: class names, raw input size; see edge/convert.py).

The HTTP server is the standard library's threading server with limits: a bounded body, a socket timeout
against slow clients, a bounded number of requests in flight (503 past it), JSON for every reply.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "model.tflite"
CONTRACT_FILE = "edge_model.json"
SOURCE_FILE = "source.json"  # which registered model version the folder came from (edge_fetch)
MLFLOW_ARTIFACT_DIR = "edge_model"  # where edge_model logs its files on trained_model's MLflow run
DEFAULT_PORT = 8500
DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024


class EdgeRuntimeError(ValueError):
    """The model folder or an input cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Classification:
    label: str
    probabilities: dict[str, float]
    latency_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "probabilities": self.probabilities, "latency_ms": round(self.latency_ms, 3)}


class EdgeClassifier:
    """One LiteRT interpreter for the model folder; calls are serialised (an interpreter is not thread-safe)."""

    def __init__(self, model_dir: str | os.PathLike, num_threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        from dgx_assets.edge.convert import INPUT_NAME, OUTPUT_NAME, SIGNATURE_KEY

        folder = Path(model_dir)
        model_path, contract_path = folder / MODEL_FILE, folder / CONTRACT_FILE
        for path in (model_path, contract_path):
            if not path.is_file():
                raise EdgeRuntimeError(
                    f"{path} is missing: point --model-dir at a folder from `dgx-assets edge-fetch` or <lake>/edge_model"
                )
        try:
            self.contract = json.loads(contract_path.read_text())
            self.class_names = [str(name) for name in self.contract["class_names"]]
        except (ValueError, KeyError, TypeError) as error:
            raise EdgeRuntimeError(f"{contract_path} is not an edge model contract ({error})") from error
        try:
            interpreter = Interpreter(model_path=str(model_path), num_threads=num_threads)
            self._runner = interpreter.get_signature_runner(SIGNATURE_KEY)
        except (ValueError, RuntimeError) as error:
            raise EdgeRuntimeError(f"LiteRT cannot load {model_path}: {error}") from error
        self._input, self._output = INPUT_NAME, OUTPUT_NAME
        shape = [int(d) for d in self._runner.get_input_details()[INPUT_NAME]["shape"]]
        self.raw_height, self.raw_width, self.channels = shape[1], shape[2], shape[3]
        outputs = int(self._runner.get_output_details()[OUTPUT_NAME]["shape"][-1])
        if outputs != len(self.class_names):
            raise EdgeRuntimeError(f"{contract_path} names {len(self.class_names)} classes, the model has {outputs} outputs")
        source = folder / SOURCE_FILE
        self.source = json.loads(source.read_text()) if source.is_file() else {}
        self._lock = threading.Lock()

    def classify(self, content: bytes) -> Classification:
        """Decode (as the edge contract says the device does) and classify one image file's bytes."""
        from dgx_assets.edge.convert import decode_to_raw

        try:
            pixels = decode_to_raw(content, self.raw_height, self.raw_width, self.channels)
        except Exception as error:  # Pillow raises many types for bad bytes; all mean "not an image we can read"
            raise EdgeRuntimeError(f"not a readable image ({type(error).__name__}: {error})") from error
        with self._lock:
            started = time.perf_counter()
            probabilities = self._runner(**{self._input: pixels[np.newaxis]})[self._output][0]
            latency = (time.perf_counter() - started) * 1000
        scores = {name: round(float(p), 6) for name, p in zip(self.class_names, probabilities)}
        return Classification(self.class_names[int(np.argmax(probabilities))], scores, latency)


def classify_folder(classifier: EdgeClassifier, folder: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """One result per regular file in ``folder`` (sorted; hidden files, links and special files skipped):
    its classification, or ``error`` with the reason. A bad file never stops the others."""
    root = Path(folder)
    if not root.is_dir():
        raise EdgeRuntimeError(f"{root} is not a folder of images")
    with os.scandir(root) as entries:
        files = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file(follow_symlinks=False))
    results = []
    for name in files[:limit] if limit else files:
        try:
            results.append({"file": name, **classifier.classify((root / name).read_bytes()).to_dict()})
        except (EdgeRuntimeError, OSError) as error:
            results.append({"file": name, "error": str(error)})
    return results


def fetch_edge_model(
    tracking_uri: str, model_name: str, out_dir: str | os.PathLike, version: str | None = None, alias: str | None = None
) -> dict[str, str]:
    """Download the edge model of a registered version (by number, or the version an alias points at) from
    its MLflow run into ``out_dir``, and record where it came from in ``source.json``."""
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    if (version is None) == (alias is None):
        raise EdgeRuntimeError("give exactly one of --version or --alias")
    client = MlflowClient(tracking_uri)
    try:
        found = client.get_model_version(model_name, version) if version else client.get_model_version_by_alias(model_name, alias)
    except MlflowException as error:
        raise EdgeRuntimeError(
            f"no version {version or alias!r} of registered model {model_name!r} at {tracking_uri}: {error.message}"
        ) from error
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        download_artifacts(run_id=found.run_id, artifact_path=MLFLOW_ARTIFACT_DIR, dst_path=str(out), tracking_uri=tracking_uri)
    except (MlflowException, OSError) as error:
        raise EdgeRuntimeError(
            f"{model_name} v{found.version} (run {found.run_id}) has no edge model: materialize edge_model for it ({error})"
        ) from error
    downloaded = out / MLFLOW_ARTIFACT_DIR
    for name in (MODEL_FILE, CONTRACT_FILE):
        if not (downloaded / name).is_file():
            raise EdgeRuntimeError(f"{model_name} v{found.version} (run {found.run_id}) has no {MLFLOW_ARTIFACT_DIR}/{name}")
        os.replace(downloaded / name, out / name)
    source = {"model_name": model_name, "version": str(found.version), "run_id": found.run_id, "tracking_uri": tracking_uri}
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2))
    return source


# --- HTTP ------------------------------------------------------------------------------------------
class EdgeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        classifier: EdgeClassifier,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_in_flight: int = 4,
        socket_timeout_s: float = 10.0,
    ):
        self.classifier = classifier
        self.max_body_bytes = max_body_bytes
        self.socket_timeout_s = socket_timeout_s
        self.slots = threading.BoundedSemaphore(max_in_flight)
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: EdgeServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.socket_timeout_s  # a client that stalls mid-request loses its connection
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # one line per request on stderr, without DNS look-ups
        print(f"{self.client_address[0]} {format % args}", flush=True)

    def _reply(self, status: int, body: dict[str, Any], close: bool = False) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: HTTPStatus, message: str, close: bool = False) -> None:
        self._reply(status, {"error": message, "status": status.value}, close)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The base class answers malformed requests in HTML; here every reply is JSON.
        status = HTTPStatus(code)
        self._error(status, message or status.phrase, close=True)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            c = self.server.classifier
            self._reply(
                HTTPStatus.OK,
                {
                    "status": "ok",
                    "class_names": c.class_names,
                    "input": [c.raw_height, c.raw_width, c.channels],
                    "source": c.source,
                },
            )
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}: use GET /healthz or POST /v1/classify")

    def do_POST(self) -> None:
        if self.path != "/v1/classify":
            return self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}: use POST /v1/classify")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self._error(HTTPStatus.LENGTH_REQUIRED, "send the image bytes with a Content-Length", close=True)
        if int(length) > self.server.max_body_bytes:
            return self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {length} bytes is over the {self.server.max_body_bytes}-byte limit",
                close=True,
            )
        if not self.server.slots.acquire(blocking=False):
            self.rfile.read(int(length))
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, "busy: too many requests in flight, retry")
        try:
            content = self.rfile.read(int(length))
            if len(content) < int(length):
                return self._error(HTTPStatus.BAD_REQUEST, "body shorter than its Content-Length", close=True)
            try:
                result = self.server.classifier.classify(content)
            except EdgeRuntimeError as error:
                return self._error(HTTPStatus.BAD_REQUEST, str(error))
            self._reply(HTTPStatus.OK, result.to_dict())
        finally:
            self.server.slots.release()


def make_server(classifier: EdgeClassifier, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **limits: Any) -> EdgeServer:
    """A bound server (port 0: any free port, read it from ``server.server_address``); call serve_forever()."""
    return EdgeServer((host, port), classifier, **limits)
