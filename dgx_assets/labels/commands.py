"""`dgx-assets import-labels FILE --batch NAME`: inspectors' labels from Label Studio or CVAT as a new landing batch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dgx_assets import settings


def _import_labels(args: argparse.Namespace) -> int:
    from dgx_assets.labels.exports import read_export
    from dgx_assets.labels.importer import ImportRefused, import_labels
    from dgx_assets.lake.store import Lake

    export = read_export(Path(args.file), choice=args.choice)
    if export.problems:
        return _refuse(args.file, export.problems)
    env = settings.environment()
    lake = Lake(args.lake or env.lake_root)
    landing = args.landing or (env.with_lake(args.lake).landing_uri if args.lake else env.landing_uri)
    try:
        done = import_labels(export.records, lake, landing, args.batch, args.allow_new_labels)
    except ImportRefused as refused:
        return _refuse(args.file, refused.problems)
    counts = ", ".join(f"{label} {n}" for label, n in sorted(done.counts.items()))
    print(f"{export.format}: {sum(done.counts.values())} images into {done.uri} ({counts})")
    return 0


def _refuse(source: str, problems: list[str]) -> int:
    for problem in problems:
        print(f"import-labels: {source}: {problem}", file=sys.stderr)
    print(f"import-labels: nothing written ({len(problems)} problem{'s' if len(problems) != 1 else ''})", file=sys.stderr)
    return 2


def register(commands) -> None:
    parser = commands.add_parser(
        "import-labels",
        help="inspectors' labels (Label Studio JSON, JSON_MIN or CSV; CVAT ImageNet folder or zip) as a new landing batch",
        description="Match each labelled image to one the lake's raw_images table holds (by sha256, else by path) and "
        "write them, read from the table, as <landing>/<NAME>-labels-<UTC time>/<label>/<file> in one rename. "
        "Any problem: one line each on stderr, exit 2, nothing written.",
    )
    parser.add_argument("file", help="the export: a .json, .csv, .zip, or a CVAT ImageNet folder")
    parser.add_argument("--batch", required=True, help="the new batch's name: <NAME>-labels-<YYYYmmddTHHMMSSZ>")
    parser.add_argument("--lake", help="lake root URI (default: DGX_LAKE_ROOT)")
    parser.add_argument("--landing", help="landing zone URI (default: DGX_LANDING_URI or <lake>/landing)")
    parser.add_argument("--choice", default="choice", help="JSON_MIN and CSV: the column of the label (<Choices name>)")
    parser.add_argument("--allow-new-labels", action="store_true", help="accept labels raw_images has never held (a new class)")
    parser.set_defaults(handler=_import_labels)
