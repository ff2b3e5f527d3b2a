"""`python -m dgx_assets.serving [serve|build-generator] ...` (serve is the default)."""

from __future__ import annotations

import argparse
import sys

from dgx_assets.serving.commands import register


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "build-generator", "-h", "--help"):
        argv.insert(0, "serve")
    parser = argparse.ArgumentParser(prog="python -m dgx_assets.serving")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
