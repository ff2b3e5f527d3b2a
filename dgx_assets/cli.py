"""The `dgx-assets` command (also `python -m dgx_assets`): seed the demo, run it, build and run the serving process."""

from __future__ import annotations

import argparse
import sys

from dgx_assets import settings


def _seed_demo(args: argparse.Namespace) -> int:
    from dgx_assets.demo import seed_landing
    from dgx_assets.generation.prompts import write_demo_prompts

    landing = args.landing or settings.landing_uri()
    counts = seed_landing(landing, batches=args.batches, limit=args.limit)
    prompts = args.prompts or settings.prompts_uri()
    write_demo_prompts(prompts)
    print(f"landing zone {landing}: " + ", ".join(f"{batch} ({n} images)" for batch, n in sorted(counts.items())))
    print(f"prompts {prompts}")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from dgx_assets.demo import run_demo

    return run_demo(limit=args.limit, batches=args.batches, verbose=args.verbose)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dgx-assets", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    seed = commands.add_parser("seed-demo", help="fill the landing zone from the ELPV package and write the demo prompts")
    seed.add_argument("--landing", help="landing zone URI (default: DGX_LANDING_URI or <lake>/landing)")
    seed.add_argument("--prompts", help="prompts file URI (default: DGX_PROMPTS_URI or <lake>/prompts/prompts.csv)")
    seed.add_argument("--batches", type=int, default=3, help="how many batch folders to spread the images over")
    seed.add_argument("--limit", type=int, help="only the first N images")
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

    from dgx_assets.serving import commands as serving_commands

    serving_commands.register(commands)  # `serve` and `build-generator`; paddle is imported only when they run
    from dgx_assets.edge import commands as edge_commands

    edge_commands.register(commands)  # `edge-run`, `edge-fetch`, `edge-manifest`; LiteRT/MLflow load when they run
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
