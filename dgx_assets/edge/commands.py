"""`edge-run`, `edge-fetch` and `edge-manifest`: the command-line side of the edge rollout.

Handlers import what they need when they run: `edge-run` loads only numpy, Pillow and LiteRT, so the
small edge image can run it without TensorFlow, Spark or MLflow.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from dgx_assets.edge.runtime import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT,
    EdgeRuntimeError,
)

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
    run.add_argument("--limit", type=int, default=None, help="--images: at most N files")
    run.add_argument("--host", default="127.0.0.1", help="--serve: address to bind (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=DEFAULT_PORT)
    run.add_argument("--threads", type=int, default=None, help="LiteRT CPU threads (default: the runtime's)")
    run.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    run.add_argument("--max-in-flight", type=int, default=4, help="requests classified at once; 503 past it")
    run.add_argument("--socket-timeout", type=float, default=10.0, help="seconds a stalled client keeps its connection")
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


def _tracking_uri(given: str | None) -> str:
    from dgx_assets import settings

    return given or settings.mlflow_tracking_uri()


def run_edge(args) -> int:
    from dgx_assets.edge.runtime import EdgeClassifier, classify_folder, make_server

    try:
        classifier = EdgeClassifier(args.model_dir, num_threads=args.threads)
        if args.images:
            results = classify_folder(classifier, args.images, args.limit)
            for result in results:
                print(json.dumps(result), flush=True)
            return 1 if any("error" in r for r in results) else 0
    except EdgeRuntimeError as error:
        print(f"edge-run: {error}", file=sys.stderr)
        return 2
    server = make_server(
        classifier,
        args.host,
        args.port,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
        socket_timeout_s=args.socket_timeout,
    )
    # SIGTERM (Kubernetes stopping the pod) ends serving as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    host, port = server.server_address[:2]
    print(f"edge-run: serving {args.model_dir} on http://{host}:{port} (POST /v1/classify, GET /healthz)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_fetch(args) -> int:
    from dgx_assets.edge.runtime import fetch_edge_model

    try:
        source = fetch_edge_model(_tracking_uri(args.tracking_uri), args.model_name, args.out, args.version, args.alias)
    except EdgeRuntimeError as error:
        print(f"edge-fetch: {error}", file=sys.stderr)
        return 2
    print(f"edge-fetch: {source['model_name']} v{source['version']} (run {source['run_id']}) -> {args.out}")
    return 0


def run_manifest(args) -> int:
    from dgx_assets.edge.kubeedge import (
        DEFAULT_TRACKING_URI,
        EDGE_IMAGE,
        champion_version,
        edge_deployment,
        render,
    )

    try:
        version = args.version or champion_version(_tracking_uri(args.tracking_uri), args.model_name)
        deployment = edge_deployment(
            args.model_name,
            version,
            namespace=args.namespace,
            image=args.image or EDGE_IMAGE,
            tracking_uri=args.pod_tracking_uri or DEFAULT_TRACKING_URI,
        )
    except ValueError as error:
        print(f"edge-manifest: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text(render(deployment))
    tmp.replace(out)
    print(f"edge-manifest: {args.model_name} v{version} -> {out}; apply with `kubectl apply -f {out}`")
    return 0
