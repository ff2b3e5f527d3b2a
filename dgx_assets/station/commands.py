"""`edge-run`: the station's command. It loads only numpy, Pillow, LiteRT and the light HTTP stack (starlette,
uvicorn, h11), so the small edge image runs it without TensorFlow, Spark, MLflow or the code location.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dgx_assets.station.runtime import (
    DEFAULT_DECODE_DEADLINE_S,
    DEFAULT_FORMATS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JPEG_SCANS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_PORT,
    EdgeRuntimeError,
)


def register(subparsers) -> None:
    run = subparsers.add_parser(
        "edge-run",
        help="classify images with the edge model (LiteRT): a folder, or over HTTP",
        description="Load <model-dir>/model.tflite with LiteRT and its contract edge_model.json, then classify "
        "every image in --images DIR (one JSON line per file), or serve POST /v1/classify (the image "
        "bytes as the body) and GET /healthz with --serve.",
    )
    run.add_argument("--model-dir", required=True, help="folder with model.tflite and edge_model.json")
    mode = run.add_mutually_exclusive_group(required=True)
    mode.add_argument("--images", help="classify the image files in this folder and exit")
    mode.add_argument("--serve", action="store_true", help="serve HTTP until SIGINT/SIGTERM")
    run.add_argument("--limit", type=_positive, default=None, help="--images: at most N files")
    run.add_argument("--host", default="127.0.0.1", help="--serve: address to bind (default 127.0.0.1)")
    run.add_argument("--port", type=_port, default=DEFAULT_PORT)
    run.add_argument("--threads", type=_positive, default=None, help="LiteRT CPU threads (default: the runtime's)")
    run.add_argument(
        "--max-body-bytes", type=_positive, default=DEFAULT_MAX_BODY_BYTES, help="largest image file, over HTTP or in --images"
    )
    run.add_argument(
        "--max-pixels",
        type=_positive,
        default=DEFAULT_MAX_PIXELS,
        help="pixel budget: width x height x bytes per pixel, read from the header before decoding (413 past it)",
    )
    run.add_argument(
        "--formats",
        type=_formats,
        default=DEFAULT_FORMATS,
        help=f"image formats taken, judged from the magic bytes (415 otherwise; default {','.join(DEFAULT_FORMATS)})",
    )
    run.add_argument(
        "--max-jpeg-scans",
        type=_positive,
        default=DEFAULT_MAX_JPEG_SCANS,
        help="most scans a (progressive) JPEG may have: each is decoded over the whole image (413 past it)",
    )
    run.add_argument(
        "--decode-deadline",
        type=_seconds,
        default=DEFAULT_DECODE_DEADLINE_S,
        help="seconds one image's decode may take before it is abandoned (422)",
    )
    run.add_argument(
        "--max-in-flight", type=_positive, default=4, help="requests classified or waiting, and bodies held; 503 past it"
    )
    run.add_argument("--max-connections", type=_positive, default=64, help="--serve: open connections; 503 past it")
    run.add_argument(
        "--socket-timeout", type=_seconds, default=10.0, help="seconds a client gets to send a request head, then its body"
    )
    run.set_defaults(handler=run_edge)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 2**40):
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text[:20]!r}")
    return int(text)


def _formats(text: str) -> tuple[str, ...]:
    names = tuple(name.strip().upper() for name in text.split(",") if name.strip())
    names = tuple("JPEG" if name == "JPG" else "TIFF" if name == "TIF" else name for name in names)
    if not names or not set(names) <= set(DEFAULT_FORMATS):
        raise argparse.ArgumentTypeError(f"must be some of {','.join(DEFAULT_FORMATS)}, got {text[:60]!r}")
    return names


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text[:20]!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be seconds, more than 0 and at most 3600, got {text[:20]!r}")
    return value


def run_edge(args) -> int:
    from dgx_assets.station.runtime import EdgeClassifier

    try:
        classifier = EdgeClassifier(
            args.model_dir,
            num_threads=args.threads,
            max_pixels=args.max_pixels,
            formats=args.formats,
            max_jpeg_scans=args.max_jpeg_scans,
            decode_deadline_s=args.decode_deadline,
        )
        if args.images:
            return _classify_images(classifier, args)
    except EdgeRuntimeError as error:
        print(f"edge-run: {error}", file=sys.stderr)
        return 2
    return _serve(classifier, args)


def _classify_images(classifier, args) -> int:
    """One JSON line per file as soon as it is known; 1 when any file was skipped or failed."""
    from dgx_assets.station.runtime import classify_folder

    failed = False
    for result in classify_folder(classifier, args.images, args.limit, args.max_body_bytes):
        failed = failed or "error" in result or "skipped" in result
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


def _serve(classifier, args) -> int:
    from dgx_assets.http_limits import configure_logging
    from dgx_assets.station.server import make_server

    configure_logging("edge-runtime")
    limits = {
        "max_body_bytes": args.max_body_bytes,
        "max_in_flight": args.max_in_flight,
        "max_connections": args.max_connections,
        "socket_timeout_s": args.socket_timeout,
    }
    try:
        server = make_server(classifier, args.host, args.port, **limits)
    except OSError as error:
        print(f"edge-run: cannot listen on {args.host}:{args.port}: {error.strerror or error}", file=sys.stderr)
        return 2
    host, port = server.server_address
    print(f"edge-run: serving {args.model_dir} on http://{host}:{port} (POST /v1/classify, GET /healthz)", flush=True)
    server.serve_forever()  # SIGTERM (Kubernetes stopping the pod) ends it as Ctrl-C does
    return 0
