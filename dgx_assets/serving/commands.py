"""`serve` and `build-generator`: the command-line side of the serving process.

`register(subparsers)` adds both to an argparse parser (the `dgx-assets` CLI and `python -m
dgx_assets.serving` share it). Paddle is imported inside the handlers only, so registering the commands
costs nothing and never loads paddle into a process that has TensorFlow or Spark in it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the ERNIE-Image serving process (Paddle Inference behind HTTP, uvicorn)",
        description="Serve a Paddle Inference generator on POST /<service>/prediction (Paddle Serving pipeline) "
        "and POST /v1/images/generations (OpenAI-compatible), with /status and /metrics, as an ASGI "
        "app on uvicorn. Flags override the config file.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(handler=run_serve)

    build = subparsers.add_parser(
        "build-generator",
        help="train and export the small Paddle generator the local serving process uses",
        description="Train the small text-conditioned generator on the demo images (ELPV when installed, or "
        "--images DIR) and export it for Paddle Inference (<out>/generator.json + .pdiparams).",
    )
    build.add_argument("--out", required=True, help="folder to write the model into")
    build.add_argument("--quick", action="store_true", help="seconds of training (tests, smoke runs)")
    build.add_argument(
        "--images", default=None, help="train on images under DIR (<DIR>/<label>/<file>) instead of the ELPV package"
    )
    build.add_argument("--epochs", type=int, default=None)
    build.add_argument("--max-seconds", type=float, default=None, help="training time budget")
    build.add_argument("--limit", type=int, default=None, help="use at most N training images")
    build.add_argument("--max-tokens", type=int, default=None, help="prompt token limit (default 256)")
    build.set_defaults(handler=run_build_generator)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    # Every default is None: "not given", so the config file's value (or the built-in default) stands.
    parser.add_argument("--model-dir", default=None, help="folder with <name>.json + <name>.pdiparams")
    parser.add_argument("--config", default=None, help="operator config file (deploy/serving/config.yml form)")
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 9998; 0 picks a free one)")
    parser.add_argument("--port-file", default=None, help="write the bound port here once listening")
    parser.add_argument("--token-env", default=None, help="environment variable holding the bearer token")
    parser.add_argument("--service-name", default=None, help="pipeline route name (default ernie_image)")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None)
    parser.add_argument("--gpu-ids", default=None, help="GPU ids, e.g. 0 or 0,1 (the first is used)")
    parser.add_argument("--no-ir-optim", dest="ir_optim", action="store_const", const=False, default=None)
    parser.add_argument("--concurrency", type=int, default=None, help="predictors running at once")
    parser.add_argument("--cpu-threads", type=int, default=None)
    parser.add_argument("--max-body-bytes", type=int, default=None, help="request body limit (default 16 KiB)")
    parser.add_argument(
        "--request-timeout-s", type=float, default=None, help="longest wait for a free predictor before 503 (default 60)"
    )
    parser.add_argument("--max-connections", type=int, default=None, help="open connections (default 2048)")
    parser.add_argument(
        "--max-queue", type=int, default=None, help="generation requests waiting beyond the running ones before 503 (default 32)"
    )
    parser.add_argument("--header-timeout-s", type=float, default=None, help="time to send a request head (default 10)")
    parser.add_argument("--body-timeout-s", type=float, default=None, help="time to send a body (default 10)")
    parser.add_argument("--keep-alive-s", type=float, default=None, help="idle keep-alive connections (default 30)")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve HTTPS (TLS 1.2 minimum)")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--engine", default=None, help="engine factory 'package.module:callable' (default: the exported Paddle generator)"
    )
    parser.add_argument(
        "--engine-option",
        dest="engine_options",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="option passed to the engine factory (repeatable)",
    )


def run_serve(args: argparse.Namespace) -> int:
    from dgx_assets.serving.config import ConfigError, build_config, parse_options
    from dgx_assets.serving.server import configure_logging, serve

    configure_logging()
    gpu_ids = tuple(int(x) for x in args.gpu_ids.split(",") if x.strip()) if args.gpu_ids else None
    try:
        config = build_config(
            args.config,
            model_dir=args.model_dir,
            host=args.host,
            port=args.port,
            token_env=args.token_env,
            service_name=args.service_name,
            device=args.device,
            gpu_ids=gpu_ids,
            ir_optim=args.ir_optim,
            concurrency=args.concurrency,
            cpu_threads=args.cpu_threads,
            max_body_bytes=args.max_body_bytes,
            request_timeout_s=args.request_timeout_s,
            max_connections=args.max_connections,
            max_queue=args.max_queue,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            keep_alive_s=args.keep_alive_s,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            engine=args.engine,
            engine_options=parse_options(args.engine_options) if args.engine_options else None,
        )
    except (ConfigError, OSError, ValueError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    return serve(config, port_file=args.port_file)


def run_build_generator(args: argparse.Namespace) -> int:
    if "tensorflow" in sys.modules:
        # Paddle in a process that already holds TensorFlow crashes (protobuf clash): train in a fresh one.
        command = [sys.executable, "-m", "dgx_assets.serving", "build-generator", *_build_flags(args)]
        return subprocess.call(command)

    from dataclasses import replace

    from dgx_assets.serving.generator import TrainSettings, train_and_export

    settings = TrainSettings.quick() if args.quick else TrainSettings()
    overrides = {"epochs": args.epochs, "max_seconds": args.max_seconds, "limit": args.limit, "max_tokens": args.max_tokens}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    try:
        train_and_export(args.out, settings, images_dir=args.images)
    except (RuntimeError, ValueError) as error:
        print(f"build-generator: {error}", file=sys.stderr)
        return 2
    return 0


def _build_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--out", args.out] + (["--quick"] if args.quick else [])
    for name in ("images", "epochs", "max_seconds", "limit", "max_tokens"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags
