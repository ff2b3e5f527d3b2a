"""`edge-run`, `edge-fetch` and `edge-manifest`: the command-line side of the edge rollout.

Handlers import what they need when they run: `edge-run` loads only numpy, Pillow, LiteRT and the light HTTP
stack (starlette, uvicorn, h11), so the small edge image can run it without TensorFlow, Spark or MLflow.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dgx_assets.edge.runtime import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PIXELS, DEFAULT_PORT, EdgeRuntimeError

REGISTERED_MODEL = "dgx_defect_classifier"  # MlflowResource's default registered_model_name


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
        "--max-in-flight", type=_positive, default=4, help="requests classified or waiting, and bodies held; 503 past it"
    )
    run.add_argument("--max-connections", type=_positive, default=64, help="--serve: open connections; 503 past it")
    run.add_argument(
        "--socket-timeout", type=_seconds, default=10.0, help="seconds a client gets to send a request head, then its body"
    )
    run.set_defaults(handler=run_edge)

    fetch = subparsers.add_parser(
        "edge-fetch",
        help="download a registered version's edge model from MLflow into a folder",
        description="Resolve a registered model version (by number or alias) in the MLflow registry and download "
        "the edge model edge_model logged on its run: model.tflite, edge_model.json, source.json.",
    )
    fetch.add_argument("--model-name", default=REGISTERED_MODEL)
    which = fetch.add_mutually_exclusive_group(required=True)
    which.add_argument("--version")
    which.add_argument("--alias")
    fetch.add_argument("--out", required=True)
    fetch.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI")
    fetch.set_defaults(handler=run_fetch)

    manifest = subparsers.add_parser(
        "edge-manifest",
        help="write the KubeEdge Deployment of the champion (or a given version)",
        description="Write a Deployment for KubeEdge edge nodes that fetches one registered version's edge model "
        "and serves it with `edge-run`. Without --version, the version the champion alias points at.",
    )
    manifest.add_argument("--model-name", default=REGISTERED_MODEL)
    manifest.add_argument("--version", default=None)
    manifest.add_argument("--out", default="edge-deployment.yaml")
    manifest.add_argument("--namespace", default="dgx-assets")
    manifest.add_argument("--image", default=None, help="edge runtime image (default dgx-assets/edge-runtime:0.1.0)")
    manifest.add_argument(
        "--pod-tracking-uri", default=None, help="MLflow address as the edge nodes reach it (default: the in-cluster service)"
    )
    manifest.add_argument(
        "--tracking-uri", default=None, help="registry to look the champion up in (default: MLFLOW_TRACKING_URI)"
    )
    manifest.set_defaults(handler=run_manifest)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 2**40):
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text[:20]!r}")
    return int(text)


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


def _tracking_uri(given: str | None) -> str:
    from dgx_assets import settings

    return given or settings.mlflow_tracking_uri()


def run_edge(args) -> int:
    from dgx_assets.edge.runtime import EdgeClassifier

    try:
        classifier = EdgeClassifier(args.model_dir, num_threads=args.threads, max_pixels=args.max_pixels)
        if args.images:
            return _classify_images(classifier, args)
    except EdgeRuntimeError as error:
        print(f"edge-run: {error}", file=sys.stderr)
        return 2
    return _serve(classifier, args)


def _classify_images(classifier, args) -> int:
    """One JSON line per file as soon as it is known; 1 when any file was skipped or failed."""
    from dgx_assets.edge.runtime import classify_folder

    failed = False
    for result in classify_folder(classifier, args.images, args.limit, args.max_body_bytes):
        failed = failed or "error" in result or "skipped" in result
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


def _serve(classifier, args) -> int:
    from dgx_assets.edge.server import make_server
    from dgx_assets.http_limits import configure_logging

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


def run_fetch(args) -> int:
    from dgx_assets.edge.fetch import fetch_edge_model

    try:
        source = fetch_edge_model(_tracking_uri(args.tracking_uri), args.model_name, args.out, args.version, args.alias)
    except EdgeRuntimeError as error:
        print(f"edge-fetch: {error}", file=sys.stderr)
        return 2
    print(
        f"edge-fetch: {source['model_name']} v{source['version']} (run {source['run_id']}) -> {args.out}; "
        f"sha256 {source['sha256']} {source['sha256_check']}"
    )
    return 0


def run_manifest(args) -> int:
    from dgx_assets.edge.kubeedge import (
        DEFAULT_TRACKING_URI,
        EDGE_IMAGE,
        champion_version,
        edge_deployment,
        render,
        shipped_edge_model,
        write_manifest,
    )

    try:
        tracking_uri = _tracking_uri(args.tracking_uri)
        version = args.version or champion_version(tracking_uri, args.model_name)
        shipped = shipped_edge_model(tracking_uri, args.model_name, version)
        deployment = edge_deployment(
            args.model_name,
            version,
            namespace=args.namespace,
            image=args.image or EDGE_IMAGE,
            tracking_uri=args.pod_tracking_uri or DEFAULT_TRACKING_URI,
            shipped=shipped,
        )
    except ValueError as error:
        print(f"edge-manifest: {error}", file=sys.stderr)
        return 2
    try:
        out = write_manifest(args.out, render(deployment))
    except ValueError as error:
        print(f"edge-manifest: {error}", file=sys.stderr)
        return 2
    shipped_as = f"edge format {shipped['format']}" if shipped else f"no edge model recorded for it at {tracking_uri}"
    print(f"edge-manifest: {args.model_name!r} v{version} ({shipped_as}) -> {out}; apply with `kubectl apply -f {out}`")
    return 0
