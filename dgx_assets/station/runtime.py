"""The edge runtime: the champion's TFLite model run with LiteRT on an inspection station.

It needs numpy, Pillow and ai-edge-litert, nothing else of the platform (no TensorFlow, Spark or MLflow):
``fetch_edge_model`` (MLflow) runs once in the pod's init container, ``EdgeClassifier`` and the HTTP server
(edge/server.py) run in the small edge container. A model folder is what edge_model logs to its MLflow run:
``model.tflite``, whose own metadata carries the contract (format, class names, raw input size, decision rule;
edge/tflite_metadata.py), and ``edge_model.json``, the same contract for people (and the only one of models built
before the contract was embedded).

This module is the classification itself: load the model and its contract, decode an image within a pixel
budget read from its header, predict. The HTTP layer and the folder mode only call it.
"""

from __future__ import annotations

import io
import json
import os
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "model.tflite"
CONTRACT_FILE = "edge_model.json"
SOURCE_FILE = "source.json"  # which registered model version the folder came from (edge_fetch)
MLFLOW_ARTIFACT_DIR = "edge_model"  # where edge_model logs its files on trained_model's MLflow run
DEFAULT_PORT = 8500
DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024  # the largest image file taken, over HTTP or from --images
# 4096 x 4096 8-bit pixels. An image costs width x height x bytes per pixel (16-bit grey twice, RGB three
# times), read from its header: decoding one at this budget peaks near 170 MB more (bench/edge.py).
DEFAULT_MAX_PIXELS = 4096 * 4096
# What a camera writes. Anything else is refused from its first bytes, before Pillow sees it: container
# formats (ICO, ICNS) pick their largest entry themselves and wrap PNG or JPEG 2000 past the pixel budget.
DEFAULT_FORMATS = ("PNG", "JPEG", "BMP", "TIFF")
# A progressive JPEG decodes every scan over the whole image (7 ms a scan at 4096 x 4096, bench/edge.py):
# cameras write 1 (baseline) or about 10; 27,621 held the worker 29 s.
DEFAULT_MAX_JPEG_SCANS = 64
DEFAULT_DECODE_DEADLINE_S = 5.0  # one image's decode, checked between the blocks the decoder reads
# Magic bytes of the formats Pillow opens (or that are sent as images), to name what was refused.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"II+\x00", "BigTIFF"),
    (b"MM\x00+", "BigTIFF"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"\x00\x00\x02\x00", "CUR"),
    (b"icns", "ICNS"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (b"8BPS", "PSD"),
    (b"DDS ", "DDS"),
    (b"qoif", "QOI"),
)


class EdgeRuntimeError(ValueError):
    """The model folder or an input cannot be used; the message says what to fix."""


class UnreadableImage(EdgeRuntimeError):
    """The bytes are not an image this runtime can decode (HTTP 422)."""


class ImageTooLarge(EdgeRuntimeError):
    """The image's header declares more pixels than the budget (HTTP 413)."""


class UnsupportedFormat(EdgeRuntimeError):
    """The bytes are not one of the formats the station takes, judged from their magic bytes (HTTP 415)."""


class TooCostlyToDecode(ImageTooLarge):
    """Within the pixel budget, but more JPEG scans than the scan budget (HTTP 413)."""


class DecodeDeadline(EdgeRuntimeError):
    """The decode ran past its deadline and was abandoned (HTTP 422)."""


@dataclass(frozen=True)
class Classification:
    label: str
    probabilities: dict[str, float]
    latency_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "probabilities": self.probabilities, "latency_ms": round(self.latency_ms, 3)}


def _json_object(path: Path, remedy: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise EdgeRuntimeError(f"{path} is unreadable ({type(error).__name__}: {str(error)[:120]}): {remedy}") from error
    if not isinstance(value, dict):
        raise EdgeRuntimeError(f"{path} must hold a JSON object, not a {type(value).__name__}: {remedy}")
    return value


def read_contract(path: Path) -> dict[str, Any]:
    """edge_model.json, with the types the runtime relies on checked (a string is not a list of class names)."""
    return check_contract(_json_object(path, "not an edge model contract"), path)


def model_contract(model_path: Path, contract_path: Path) -> tuple[dict[str, Any], str]:
    """The contract the model carries in its own metadata, else (a model built before it did) edge_model.json;
    with where it came from."""
    from dgx_assets.station.tflite_metadata import MetadataError, read_contract_file

    try:
        return check_contract(read_contract_file(model_path), model_path), "model metadata"
    except MetadataError as error:
        if not contract_path.is_file():
            raise EdgeRuntimeError(f"{model_path}: {error}, and there is no {contract_path.name} beside it") from error
    return read_contract(contract_path), contract_path.name


def check_contract(contract: dict[str, Any], path: Path) -> dict[str, Any]:
    """The contract's types the runtime relies on, checked; a one-line error naming the field otherwise."""
    names = contract.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and 0 < len(n) <= 200 for n in names):
        raise EdgeRuntimeError(f"{path}: class_names must be a non-empty list of names, got {str(names)[:80]!r}")
    if len(set(names)) != len(names):
        raise EdgeRuntimeError(f"{path}: class_names repeats a name: {names[:20]}")
    for key in ("raw_height", "raw_width"):
        value = contract.get(key)
        if value is not None and (type(value) is not int or not 0 < value <= 65535):
            raise EdgeRuntimeError(f"{path}: {key} must be a positive integer, got {str(value)[:40]!r}")
    decision = contract.get("decision") or {}
    threshold, positive = decision.get("threshold"), decision.get("positive_index")
    if not isinstance(decision, dict) or (threshold is None) != (positive is None):
        raise EdgeRuntimeError(f"{path}: decision must give both threshold and positive_index, or neither")
    if threshold is not None and not (type(threshold) in (int, float) and 0 < threshold < 1):
        raise EdgeRuntimeError(f"{path}: decision.threshold must be a probability in (0, 1), got {str(threshold)[:40]!r}")
    if positive is not None and not (type(positive) is int and 0 <= positive < len(names) == 2):
        raise EdgeRuntimeError(f"{path}: decision.positive_index must index one of two classes, got {str(positive)[:40]!r}")
    return contract


def _read_source(path: Path) -> dict[str, Any]:
    return _json_object(path, "fetch the model again with edge-fetch") if path.is_file() else {}


def sniff_format(content: bytes) -> str | None:
    """The image format the first bytes name (Pillow's name for the allowed ones), None when none matches."""
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _MAGIC if content.startswith(magic)), None)


def check_format(content: bytes, formats: tuple[str, ...] = DEFAULT_FORMATS) -> str:
    """The format, from the magic bytes, if it is one of ``formats``; UnsupportedFormat otherwise."""
    found = sniff_format(content)
    if found is None or found not in formats:
        what = f"a {found} file" if found else "not a known image format"
        raise UnsupportedFormat(f"{what}: the station takes {', '.join(formats)} (--formats)")
    return found


def count_jpeg_scans(content: bytes) -> int:
    """Start-of-scan markers (FF DA): entropy-coded data stuffs every FF with 00, so only markers match."""
    return content.count(b"\xff\xda")


def check_jpeg_scans(content: bytes, max_scans: int) -> None:
    scans = count_jpeg_scans(content)
    if scans > max_scans:
        raise TooCostlyToDecode(
            f"a JPEG of {scans} scans is over the budget of {max_scans} (--max-jpeg-scans): "
            "each scan is decoded over the whole image; send a baseline or ordinary progressive JPEG"
        )


def bytes_per_pixel(mode: str) -> int:
    from PIL import ImageMode

    described = ImageMode.getmode(mode)
    return len(described.bands) * np.dtype(described.typestr).itemsize


def check_pixel_budget(content: bytes, max_pixels: int, formats: tuple[str, ...] | None = None) -> None:
    """Refuse an image whose header declares more than the budget, before a pixel is decoded: it costs
    width x height x bytes per pixel against ``max_pixels`` 8-bit pixels. ``formats``: the only ones opened."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the budget below is tighter
            with Image.open(io.BytesIO(content), formats=formats) as image:
                (width, height), mode = image.size, image.mode
    except Exception as error:  # Pillow raises many types for bad bytes; all mean "not an image we can read"
        raise UnreadableImage(f"not a readable image ({type(error).__name__}: {str(error)[:200]})") from error
    check_decoded_pixels(width, height, mode, max_pixels)


def check_decoded_pixels(width: int, height: int, mode: str, max_pixels: int) -> None:
    if width * height * bytes_per_pixel(mode) > max_pixels:
        per_pixel = bytes_per_pixel(mode)
        raise ImageTooLarge(
            f"a {width}x{height} {mode} image ({per_pixel} bytes a pixel) is over the pixel budget of "
            f"{max_pixels} 8-bit pixels (--max-pixels): send a smaller image"
        )


class EdgeClassifier:
    """One LiteRT interpreter for the model folder; calls are serialised (an interpreter is not thread-safe)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        num_threads: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        formats: tuple[str, ...] = DEFAULT_FORMATS,
        max_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS,
        decode_deadline_s: float = DEFAULT_DECODE_DEADLINE_S,
    ):
        from ai_edge_litert.interpreter import Interpreter

        from dgx_assets.station.device import INPUT_NAME, OUTPUT_NAME, SIGNATURE_KEY

        folder = Path(model_dir)
        model_path, contract_path = folder / MODEL_FILE, folder / CONTRACT_FILE
        if not model_path.is_file():
            raise EdgeRuntimeError(
                f"{model_path} is missing: point --model-dir at a folder from `dgx-assets edge-fetch` or <lake>/edge_model"
            )
        self.contract, self.contract_source = model_contract(model_path, contract_path)
        self.class_names = list(self.contract["class_names"])
        self.format = str(self.contract.get("format") or self.contract.get("quantization") or "unknown")
        decision = self.contract.get("decision") or {}
        # model_contract checked that the decision gives both or neither
        self.threshold: float | None = decision.get("threshold")
        self.positive_index: int | None = decision.get("positive_index")
        self.max_pixels = max_pixels
        unknown = sorted(set(formats) - set(DEFAULT_FORMATS))
        if not formats or unknown:
            raise EdgeRuntimeError(f"--formats takes some of {', '.join(DEFAULT_FORMATS)}, not {unknown or 'none'}")
        self.formats, self.max_jpeg_scans, self.decode_deadline_s = tuple(formats), max_jpeg_scans, decode_deadline_s
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
        self.source = _read_source(folder / SOURCE_FILE)
        self._lock = threading.Lock()

    def classify(self, content: bytes) -> Classification:
        """Decode (as the edge contract says the device does) and classify one image file's bytes."""
        from dgx_assets.station.device import DeadlinePassed, decode_to_raw

        # Cheapest first, each before Pillow reads further: the magic bytes, the scans, the header's size.
        if check_format(content, self.formats) == "JPEG":
            check_jpeg_scans(content, self.max_jpeg_scans)
        check_pixel_budget(content, self.max_pixels, self.formats)
        deadline = time.monotonic() + self.decode_deadline_s
        try:
            pixels = decode_to_raw(
                content, self.raw_height, self.raw_width, self.channels, self.formats, deadline, self.max_pixels
            )
        except DeadlinePassed as error:
            raise DecodeDeadline(
                f"decoding took more than {self.decode_deadline_s:g}s and was abandoned (--decode-deadline)"
            ) from error
        except ValueError as error:
            if "pixel budget" in str(error):
                raise ImageTooLarge(str(error)) from error
            raise UnreadableImage(f"not a readable image ({type(error).__name__}: {str(error)[:200]})") from error
        except MemoryError:
            raise  # not the image's fault: said as such, and the process goes on
        except Exception as error:  # Pillow raises many types for bad bytes; all mean "not an image we can read"
            raise UnreadableImage(f"not a readable image ({type(error).__name__}: {str(error)[:200]})") from error
        with self._lock:
            started = time.perf_counter()
            probabilities = self._runner(**{self._input: pixels[np.newaxis]})[self._output][0]
            latency = (time.perf_counter() - started) * 1000
        scores = {name: round(float(p), 6) for name, p in zip(self.class_names, probabilities)}
        return Classification(self.class_names[self.decide(probabilities)], scores, latency)

    def decide(self, probabilities: np.ndarray) -> int:
        """The class trained_model's decision rule picks: its threshold on P(positive), else the most probable."""
        if self.threshold is None:
            return int(np.argmax(probabilities))
        positive = self.positive_index
        assert positive is not None  # set with the threshold
        return positive if float(probabilities[positive]) >= self.threshold else 1 - positive

    @property
    def decision_rule(self) -> str:
        if self.threshold is None or self.positive_index is None:
            return "the most probable class"
        return f"{self.class_names[self.positive_index]} when its probability is at least {self.threshold:g}"


def classify_folder(
    classifier: EdgeClassifier, folder: str | os.PathLike, limit: int | None = None, max_file_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> Iterator[dict[str, Any]]:
    """One result per regular file in ``folder`` (sorted; hidden files, links and special files skipped), each
    yielded as soon as it is known: its classification, ``skipped`` (over ``max_file_bytes``) or ``error``.
    A bad file, even one that exhausts memory, never costs the others their results."""
    root = Path(folder)
    if not root.is_dir():
        raise EdgeRuntimeError(f"{root} is not a folder of images")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise EdgeRuntimeError(f"--limit must be a whole number of files, at least 1, got {limit!r}")
    with os.scandir(root) as entries:
        files = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file(follow_symlinks=False))
    for name in files[:limit]:
        try:
            yield {"file": name, **_classify_file(classifier, root / name, max_file_bytes)}
        except (EdgeRuntimeError, OSError) as error:
            yield {"file": name, "error": str(error)}
        except MemoryError:
            yield {"file": name, "error": "MemoryError: out of memory reading or decoding this file"}
        except Exception as error:  # a bug or a runtime failure: this file's line says so, the next one runs
            yield {"file": name, "error": f"{type(error).__name__}: {str(error)[:200]}"}


def _classify_file(classifier: EdgeClassifier, path: Path, max_file_bytes: int) -> dict[str, Any]:
    # No link is followed and no FIFO opened, even one swapped in since the listing.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return {"skipped": "not a regular file any more"}
        if info.st_size > max_file_bytes:
            return {"skipped": f"{info.st_size} bytes, over the {max_file_bytes}-byte limit (--max-body-bytes)"}
        content = handle.read(info.st_size + 1)  # read(n) allocates n bytes: never the cap itself
    if len(content) > info.st_size:
        return {"skipped": "grew while it was read: still being written?"}
    return classifier.classify(content).to_dict()
