"""`edge-fetch` and `edge-manifest`: the operator's side of the edge rollout (the MLflow registry to the stations).

Handlers import what they need when they run: an edge-only install with mlflow-skinny can run them.
"""

from __future__ import annotations

import sys

from dgx_assets.station.runtime import EdgeRuntimeError

REGISTERED_MODEL = "dgx_defect_classifier"  # MlflowResource's default registered_model_name


def register(subparsers) -> None:
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

    return given or settings.environment().mlflow_tracking_uri


def run_fetch(args) -> int:
    from dgx_assets.fleet.fetch import fetch_edge_model

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
    from dgx_assets.fleet.kubeedge import (
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
