"""The `dgx-assets` command (also `python -m dgx_assets`): seed the demo, run it, build and run the serving process."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys


def _seed_demo(args: argparse.Namespace) -> int:
    from dgx_assets import settings
    from dgx_assets.demo_seed import seed_landing
    from dgx_assets.generation.prompts import write_demo_prompts

    landing = args.landing or settings.environment().landing_uri
    counts = seed_landing(landing, batches=args.batches, limit=args.limit, package_order=args.package_order)
    prompts = args.prompts or settings.environment().prompts_uri
    write_demo_prompts(prompts)
    print(f"landing zone {landing}: " + ", ".join(f"{batch} ({n} images)" for batch, n in sorted(counts.items())))
    print(f"prompts {prompts}")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from dgx_assets.demo import run_demo

    return run_demo(limit=args.limit, batches=args.batches, verbose=args.verbose)


def _docs_server(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from dgx_assets import settings
    from dgx_assets.reporting.docs_server import serve

    default = urlsplit(settings.environment().docs_url)
    host, port = args.host or default.hostname or "127.0.0.1", args.port or default.port or 3001
    # Ctrl-C and SIGTERM stop it even when started in the background, where the shell hands it SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with serve(host, port) as server, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: closed, exit 0
        print(f"The quality report and GE's data docs, read-only, on http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
        server.serve_forever()
    return 0


# What an edge-only install (`pip install '.[edge]'`) runs: their parser imports nothing but the edge side.
EDGE_COMMANDS = ("edge-run", "edge-fetch", "edge-manifest")


def _register_station_commands(commands) -> None:
    """`edge-run` (the station's runtime), `edge-fetch` and `edge-manifest` (the operator's tools); LiteRT and MLflow
    load when they run."""
    from dgx_assets.fleet import commands as fleet_commands
    from dgx_assets.station import commands as station_commands

    station_commands.register(commands)
    fleet_commands.register(commands)


def build_parser(edge_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dgx-assets", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    if edge_only:
        _register_station_commands(commands)
        return parser

    seed = commands.add_parser("seed-demo", help="fill the landing zone from the ELPV package and write the demo prompts")
    seed.add_argument("--landing", help="landing zone URI (default: DGX_LANDING_URI or <lake>/landing)")
    seed.add_argument("--prompts", help="prompts file URI (default: DGX_PROMPTS_URI or <lake>/prompts/prompts.csv)")
    seed.add_argument("--batches", type=int, default=3, help="how many batch folders to spread the images over")
    seed.add_argument("--limit", type=int, help="only the first N images")
    seed.add_argument(
        "--package-order",
        action="store_true",
        help="batches in ELPV's file order (grouped by cell type: the report flags drift) instead of a stable random deal",
    )
    seed.set_defaults(handler=_seed_demo)

    demo = commands.add_parser("demo", help="seed the landing zone if empty, then materialize every asset end to end")
    demo.add_argument("--batches", type=int, default=3)
    demo.add_argument("--limit", type=int, help="only the first N ELPV images (a quick look)")
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="print Dagster's full event log instead of one line per step (it always goes to a file)",
    )
    demo.set_defaults(handler=_run_demo)

    docs = commands.add_parser(
        "docs-server", help="serve the quality report and GE's data docs over http, read-only (make dev starts it)"
    )
    docs.add_argument("--host", help="default: the host of DGX_DOCS_URL (127.0.0.1)")
    docs.add_argument("--port", type=int, help="default: the port of DGX_DOCS_URL (3001)")
    docs.set_defaults(handler=_docs_server)

    from dgx_assets.serving import commands as serving_commands

    serving_commands.register(commands)  # `serve` and `build-generator`; paddle is imported only when they run
    _register_station_commands(commands)
    from dgx_assets.lake import commands as lake_commands

    lake_commands.register(commands)  # `lake snapshots|export|maintain|migrate`: the Iceberg tables
    from dgx_assets.labels import commands as labels_commands

    labels_commands.register(commands)  # `import-labels`: inspectors' labels back as a landing batch
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        parser = build_parser(edge_only=command in EDGE_COMMANDS)
    except ModuleNotFoundError as error:  # an edge-only install asked for more than the edge commands
        if (error.name or "").startswith("dgx_assets"):
            raise
        print(
            f"dgx-assets: {error} - this install has the edge runtime only ({', '.join(EDGE_COMMANDS)}); "
            "the other commands need the core and serving extras (README.md, Install)",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
