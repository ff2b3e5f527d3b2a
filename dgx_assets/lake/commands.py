"""`dgx-assets lake ...`: the lake's Iceberg tables from the command line (list, export, maintain, migrate)."""

from __future__ import annotations

import argparse
import datetime as dt
import json

from dgx_assets import settings


def _lake(args: argparse.Namespace):
    from dgx_assets.lake.store import Lake

    return Lake(args.lake or settings.environment().lake_root, catalog_uri=args.catalog)


def _snapshots(args: argparse.Namespace) -> int:
    lake = _lake(args)
    for name in [args.table] if args.table else lake.tables.names():
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
            print(f"MLflow run {args.mlflow_run} names no table snapshot (tags dgx.table, dgx.snapshot_id)")
            return 2
        table, snapshot_id = tags["dgx.table"].split(".", 1)[1], int(tags["dgx.snapshot_id"])
    if not table or not snapshot_id:
        print("give TABLE and --snapshot ID, or --mlflow-run RUN_ID")
        return 2
    rows = _lake(args).tables.scan(table, args.columns.split(",") if args.columns else None, snapshot_id=snapshot_id)
    if rows is None:
        print(f"dgx.{table} does not exist or has no snapshot yet (`dgx-assets lake snapshots` lists the tables)")
        return 2
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
    from dgx_assets.lake.maintenance import migrate

    done = migrate(_lake(args))
    print(f"migrated: {json.dumps(done)}" if done else "nothing to migrate: every table is an Iceberg table")
    return 0


def register(commands) -> None:
    from dgx_assets.lake.tables import EXPIRE_OLDER_THAN, ORPHAN_OLDER_THAN, RETAIN_LAST

    lake = commands.add_parser("lake", help="the lake's Iceberg tables: snapshots, export (time travel), maintain, migrate")
    lake.add_argument("--lake", help="lake root (default: DGX_LAKE_ROOT or <state>/lake)")
    lake.add_argument("--catalog", help="catalog URI (default: DGX_CATALOG_URI or a sqlite file beside a local lake)")
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
