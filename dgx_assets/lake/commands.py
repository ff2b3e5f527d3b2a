"""`dgx-assets lake ...`: the lake's Iceberg tables from the command line (list, export, maintain, migrate,
register).

A catalog or metadata file that cannot be read (corrupt, truncated, locked), an unknown table or snapshot, or a
refusal of maintenance or migration is answered with one line on stderr and a non-zero exit; `--verbose`
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
from collections.abc import Callable

from dgx_assets import settings

NOT_FOUND = 2  # an unknown table or snapshot, or arguments that name none
FAILED = 1  # the catalog, a metadata file or the lake's state stopped the command


def _fail(action: str, message: str, code: int = FAILED) -> int:
    print(f"dgx-assets lake {action}: {' '.join(message.split())}", file=sys.stderr)
    return code


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The handler, its errors turned into one line on stderr (the traceback with --verbose)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except Exception as error:
            if getattr(args, "verbose", False):
                raise
            return _fail(args.action, _explain(error, args))

    return run


def _explain(error: Exception, args: argparse.Namespace) -> str:
    """One line saying what stopped a command, and what to do."""
    from dgx_assets.lake.maintenance import MaintenanceRefused
    from dgx_assets.lake.migration import MigrationRefused
    from dgx_assets.lake.tables import LegacyLayoutError, TableMissingError

    if isinstance(error, MaintenanceRefused | MigrationRefused | LegacyLayoutError | TableMissingError):
        return str(error)
    catalog = _catalog_uri(args)
    from sqlalchemy.exc import DBAPIError  # pyiceberg's SQL catalog

    if isinstance(error, DBAPIError):
        reason = str(getattr(error, "orig", None) or error).splitlines()[0]
        if "locked" in reason or "busy" in reason:
            return f"the catalog {catalog} is locked by another process ({reason}): run again once it has finished"
        return (
            f"the catalog {catalog} cannot be read ({reason}): restore it from a copy, or start an empty one and put "
            "the tables back with `dgx-assets lake register`"
        )
    broken = _broken_metadata(args)
    if broken:
        return broken
    reason = " ".join(str(error).split())[:300]
    return f"{type(error).__name__}: {reason} (--verbose shows the traceback)"


def _catalog_uri(args: argparse.Namespace) -> str:
    try:
        return _lake(args).tables.catalog_uri
    except Exception:
        return args.catalog or "(the catalog)"


def _broken_metadata(args: argparse.Namespace) -> str | None:
    """The first table of the catalog whose metadata file cannot be read, said in a line; None when every one
    reads (or the catalog itself cannot be read)."""
    try:
        catalog = _lake(args).tables.catalog
        identifiers = catalog.list_tables("dgx")
    except Exception:
        return None
    for identifier in identifiers:
        try:
            catalog.load_table(identifier)
        except Exception as error:
            location = _metadata_location(catalog, identifier[-1])
            reason = " ".join(str(error).split())[:200]
            return (
                f"dgx.{identifier[-1]}: its metadata file {location} cannot be read ({type(error).__name__}: {reason}): "
                "restore it from a copy, or point the catalog at the newest readable one (pyiceberg: "
                f"catalog.register_table(('dgx', '{identifier[-1]}'), <file>, overwrite=True))"
            )
    return None


def _metadata_location(catalog, name: str) -> str:
    try:
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        with Session(catalog.engine) as session:
            query = select(IcebergTables.metadata_location).where(IcebergTables.table_name == name)
            return str(session.execute(query).scalar())
    except Exception:
        return "(unknown)"


def _lake(args: argparse.Namespace):
    from dgx_assets.lake.store import Lake

    return Lake(args.lake or settings.environment().lake_root, catalog_uri=args.catalog)


def _snapshots(args: argparse.Namespace) -> int:
    from dgx_assets.lake.tables import TABLES

    lake = _lake(args)
    names = lake.tables.names()
    if args.table and args.table not in names and args.table not in TABLES:
        return _fail(
            args.action, f"the catalog has no table dgx.{args.table} (its tables: {', '.join(names) or 'none'})", NOT_FOUND
        )
    for name in [args.table] if args.table else names:
        table = lake.tables.table(name)
        print(f"dgx.{name}  {table.location() if table else '(not created)'}")
        for row in lake.tables.history(name):
            print(
                f"  {row['snapshot_id']}  {row['committed_at']}  {row['operation']:<9} rows {row['total_records']}"
                f"  run {row['dagster_run_id'] or '-'}"
            )
    return 0


def _export(args: argparse.Namespace) -> int:
    """The rows of one snapshot (time travel) into one Parquet file."""
    import pyarrow.parquet as pq

    table, snapshot_id = args.table, args.snapshot
    if args.mlflow_run:
        from mlflow import MlflowClient

        tags = MlflowClient(settings.environment().mlflow_tracking_uri).get_run(args.mlflow_run).data.tags
        if "dgx.snapshot_id" not in tags:
            message = f"MLflow run {args.mlflow_run} names no table snapshot (tags dgx.table, dgx.snapshot_id)"
            return _fail(args.action, message, NOT_FOUND)
        table, snapshot_id = tags["dgx.table"].split(".", 1)[1], int(tags["dgx.snapshot_id"])
    if not table or not snapshot_id:
        return _fail(args.action, "give TABLE and --snapshot ID, or --mlflow-run RUN_ID", NOT_FOUND)
    lake = _lake(args)
    found = lake.tables.table(table)
    if found is not None and found.snapshot_by_id(snapshot_id) is None:
        return _fail(
            args.action,
            f"dgx.{table} has no snapshot {snapshot_id} (expired by `dgx-assets lake maintain`?): "
            f"`dgx-assets lake snapshots {table}` lists its snapshots",
            NOT_FOUND,
        )
    rows = lake.tables.scan(table, args.columns.split(",") if args.columns else None, snapshot_id=snapshot_id)
    if rows is None:
        message = f"dgx.{table} does not exist or has no snapshot yet (`dgx-assets lake snapshots` lists the tables)"
        return _fail(args.action, message, NOT_FOUND)
    pq.write_table(rows, args.out)
    print(f"dgx.{table} at snapshot {snapshot_id}: {rows.num_rows} rows -> {args.out}")
    return 0


def _maintain(args: argparse.Namespace) -> int:
    from dgx_assets.lake.maintenance import maintain

    report = maintain(
        _lake(args),
        expire_older_than=dt.timedelta(days=args.expire_older_than_days),
        retain_last=args.retain_last,
        orphan_older_than=dt.timedelta(days=args.orphan_older_than_days),
        dry_run=args.dry_run,
    )
    print(json.dumps(report, indent=2))
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from dgx_assets.lake.migration import migrate

    done = migrate(_lake(args), log=lambda line: print(line, flush=True))
    print(f"migrated: {json.dumps(done)}" if done else "nothing to migrate: every table is an Iceberg table")
    return 0


def _register(args: argparse.Namespace) -> int:
    from dgx_assets.lake.maintenance import register_tables

    registered = register_tables(_lake(args), args.tables or None)
    for name, location in registered.items():
        print(f"dgx.{name}: registered from {location}")
    if not registered:
        print("nothing to register: the catalog knows every table of the warehouse")
    return 0


def register(commands) -> None:
    from dgx_assets.lake.tables import EXPIRE_OLDER_THAN, ORPHAN_OLDER_THAN, RETAIN_LAST

    lake = commands.add_parser(
        "lake", help="the lake's Iceberg tables: snapshots, export (time travel), maintain, migrate, register"
    )
    lake.add_argument("--lake", help="lake root (default: DGX_LAKE_ROOT or <state>/lake)")
    lake.add_argument("--catalog", help="catalog URI (default: DGX_CATALOG_URI or a sqlite file beside a local lake)")
    verbose = "on an error, the traceback instead of one line"
    lake.add_argument("--verbose", action="store_true", help=verbose)
    actions = lake.add_subparsers(dest="action", required=True)

    snapshots = actions.add_parser("snapshots", help="list the tables and their snapshots")
    snapshots.add_argument("table", nargs="?")
    snapshots.set_defaults(handler=_snapshots)

    export = actions.add_parser("export", help="write the rows of one snapshot to a Parquet file (time travel)")
    export.add_argument("table", nargs="?", help="raw_images, image_features or ernie_generated_images")
    export.add_argument("--snapshot", type=int, help="the snapshot id (a materialization's snapshot_id)")
    export.add_argument("--mlflow-run", help="take table and snapshot from a training run's tags (dgx.table, dgx.snapshot_id)")
    export.add_argument("--columns", help="comma-separated columns (default: all)")
    export.add_argument("--out", required=True, help="the Parquet file to write")
    export.set_defaults(handler=_export)

    maintain = actions.add_parser("maintain", help="expire old snapshots, then delete the files no snapshot references")
    maintain.add_argument("--expire-older-than-days", type=float, default=EXPIRE_OLDER_THAN.days)
    maintain.add_argument("--retain-last", type=int, default=RETAIN_LAST)
    maintain.add_argument("--orphan-older-than-days", type=float, default=ORPHAN_OLDER_THAN.days)
    maintain.add_argument("--dry-run", action="store_true", help="list the orphan files, delete and expire nothing")
    maintain.set_defaults(handler=_maintain)

    migrate = actions.add_parser("migrate", help="convert tables of the folder layout of before Iceberg, batch by batch")
    migrate.set_defaults(handler=_migrate)

    registering = actions.add_parser(
        "register", help="put the warehouse's tables an emptied catalog lost back into it, from their newest metadata file"
    )
    registering.add_argument("tables", nargs="*", help="the tables (default: every one the catalog does not know)")
    registering.set_defaults(handler=_register)

    # Every action takes --verbose after it too, and answers an error in one line without it.
    for parser in (snapshots, export, maintain, migrate, registering):
        parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose)
        parser.set_defaults(handler=_guarded(parser.get_default("handler")))
