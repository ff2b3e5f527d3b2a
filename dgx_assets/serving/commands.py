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
    build.add_argument("--seed", type=int, default=None, help="training seed (default 0)")
    build.set_defaults(handler=run_build_generator)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The process's own two flags, then one per setting of ServingConfig (help from its descriptions)."""
    from dgx_assets.flags import add_model_flags
    from dgx_assets.serving.config import ServingConfig

    parser.add_argument("--config", default=None, help="operator config file (deploy/serving/config.yml form)")
    parser.add_argument("--port-file", default=None, help="write the bound port here once listening")
    # Every default is None: "not given", so the config file's value (or the built-in default) stands.
    add_model_flags(parser, ServingConfig)


def run_serve(args: argparse.Namespace) -> int:
    from dgx_assets.flags import given_flags
    from dgx_assets.http_limits import configure_logging
    from dgx_assets.serving.config import ConfigError, ServingConfig, build_config
    from dgx_assets.serving.server import serve

    configure_logging("ernie-serving")
    try:
        config = build_config(args.config, **{name: value for name, (value, _) in given_flags(args, ServingConfig).items()})
    except (ConfigError, OSError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    return serve(config, port_file=args.port_file)


# build-generator's flags that override a TrainSettings field of the same name.
_TRAIN_SETTING_FLAGS = ("epochs", "max_seconds", "limit", "max_tokens", "seed")


def run_build_generator(args: argparse.Namespace) -> int:
    if "tensorflow" in sys.modules:
        # Paddle in a process that already holds TensorFlow crashes (protobuf clash): train in a fresh one.
        command = [sys.executable, "-m", "dgx_assets.serving", "build-generator", *_build_flags(args)]
        return subprocess.call(command)

    from dataclasses import replace

    from dgx_assets.serving.generator import TrainSettings, train_and_export

    settings = TrainSettings.quick() if args.quick else TrainSettings()
    given = {name: getattr(args, name) for name in _TRAIN_SETTING_FLAGS if getattr(args, name) is not None}
    settings = replace(settings, **given)
    try:
        train_and_export(args.out, settings, images_dir=args.images)
    except (RuntimeError, ValueError) as error:
        print(f"build-generator: {error}", file=sys.stderr)
        return 2
    return 0


def _build_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--out", args.out] + (["--quick"] if args.quick else [])
    for name in ("images", *_TRAIN_SETTING_FLAGS):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags
