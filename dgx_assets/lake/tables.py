"""The lake's tables: Apache Iceberg tables in one catalog, read and committed through pyiceberg.

Executors write Parquet files into a folder of their own under the table's data location; nothing reads a
folder. The driver then commits one Iceberg transaction per materialization: for a partition, delete the
batch's rows and add the new files, so a reader sees the old version or the new one, never both, never half.
A commit that loses a race with another writer (another partition, another host) is redone on the fresh
table, up to COMMIT_ATTEMPTS times. Files a failed run wrote are deleted on its abort path, or by
`remove_orphan_files` when the process was killed (`dgx-assets lake maintain`).

Readers take the data files of one snapshot (`snapshot`): Spark and pyarrow read exactly those files, and the
snapshot id goes into the lineage, so the same rows can be read again later (time travel).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import posixpath
import random
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from dgx_assets.lake.files import (
    PARTITION_COLUMN,
    child_uri,
    filesystem_for,
    from_location,
    location_path,
    normalize_uri,
    partition_folder,
    to_location,
    visible_files,
)
from dgx_assets.lake.locks import file_lock

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from dgx_assets.lake.store import Lake

NAMESPACE = "dgx"
# The lake's tables; a partitioned one is partitioned by `batch` (identity), the others replaced whole.
PARTITIONED_TABLES = ("raw_images", "image_features")
UNPARTITIONED_TABLES = ("ernie_generated_images",)
TABLES = PARTITIONED_TABLES + UNPARTITIONED_TABLES
COMMIT_ATTEMPTS = 8  # optimistic retries of a commit that lost a race with another writer
RUN_PROPERTY = "dgx.dagster-run-id"  # snapshot summary property: the Dagster run that committed it
# Snapshot summary property: a folder of files that are not table data but belong to this version (the
# generated PNGs); maintenance deletes such folders once no kept snapshot names them.
FILES_FOLDER = "dgx.files-folder"
# Maintenance defaults, safe for readers still running: a snapshot is expired only when older than a week
# and not among the last ten; a file no snapshot names is deleted only when older than three days (a
# run still writing its files has not committed them yet). Iceberg's own defaults are 5 days and 3 days.
EXPIRE_OLDER_THAN = dt.timedelta(days=7)
RETAIN_LAST = 10
ORPHAN_OLDER_THAN = dt.timedelta(days=3)

logging.getLogger("pyiceberg.io.pyarrow").setLevel(logging.ERROR)  # "statistics missing" for each image column


class TableMissingError(LookupError):
    """The table has no snapshot yet; the message says which asset to materialize."""


class LegacyLayoutError(RuntimeError):
    """The lake still holds a table in the folder layout of before Iceberg; the message names the command."""


# (lake root, table) pairs found free of the folder layout in this process; a layout found is refused every time.
_LAYOUT_CHECKED: set[tuple[str, str]] = set()


def catalog_properties(uri: str, warehouse: str) -> dict[str, str]:
    """pyiceberg's properties for the catalog named by one URI (DGX_CATALOG_URI)."""
    scheme = urlparse(uri).scheme
    if scheme.startswith(("sqlite", "postgresql", "mysql")):
        kind = "sql"
    elif scheme in ("http", "https"):
        kind = "rest"
    elif scheme == "thrift":
        kind = "hive"
    else:
        raise ValueError(
            f"DGX_CATALOG_URI={uri!r}: use sqlite:///file.db or postgresql+psycopg2://... (SQL catalog), "
            "http(s)://host/ (REST catalog) or thrift://host:9083 (Hive metastore)"
        )
    # pyarrow's FileIO: file:// and hdfs:// (HadoopFileSystem, libhdfs), the filesystems the lake speaks.
    properties = {"type": kind, "uri": uri, "warehouse": warehouse, "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    if kind == "sql":
        properties["init_catalog_tables"] = "true"
    return properties


@dataclass(frozen=True)
class TableSnapshot:
    """The data files of one snapshot of a table (all of them, or one batch's), on one filesystem."""

    table: str
    snapshot_id: int | None  # None: the table has no snapshot yet
    uris: tuple[str, ...]
    filesystem: pafs.FileSystem | None = None
    paths: tuple[str, ...] = ()  # the files as `filesystem` names them

    def dataset(self):
        import pyarrow.dataset as pads

        return pads.dataset(list(self.paths), filesystem=self.filesystem, format="parquet")


@dataclass
class LakeTables:
    """The catalog of one lake. Tables are `dgx.<asset>`; a new table's files go under the warehouse."""

    lake: Lake
    catalog_uri: str
    warehouse: str
    allow_legacy: bool = False  # set by the migration: the one reader of the folder layout
    _catalog: Any = field(default=None, init=False, repr=False)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            if urlparse(normalize_uri(self.warehouse)).scheme in ("webhdfs", "swebhdfs"):
                raise ValueError(
                    f"the tables' warehouse {self.warehouse} is WebHDFS, which pyiceberg's file IO cannot write (it speaks "
                    "file://, hdfs:// through libhdfs, and object stores): set DGX_CATALOG_WAREHOUSE to the cluster's "
                    "hdfs:// URI; the rest of the lake may stay on webhdfs://"
                )
            # pyiceberg takes a location as it is (a quoted `%20` would make a sibling folder of that name).
            properties = catalog_properties(self.catalog_uri, to_location(normalize_uri(self.warehouse)))
            initialising = contextlib.nullcontext()
            if properties["uri"].startswith("sqlite:///"):
                # The first use of a sqlite catalog creates its tables and the namespace, each a check then a
                # write: processes starting at once (Spark tasks, a sensor's runs) would break each other's.
                from sqlalchemy.engine import make_url  # its database path, unquoted as SQLAlchemy unquotes it

                initialising = file_lock(f"{make_url(properties['uri']).database}.init.lock")
            with initialising:
                catalog = load_catalog(NAMESPACE, **properties)
                catalog.create_namespace_if_not_exists(NAMESPACE)
            self._catalog = catalog
        return self._catalog

    # --- reading ------------------------------------------------------------------------------------
    def table(self, name: str) -> Table | None:
        """The table, or None when it has never been committed."""
        from pyiceberg.exceptions import NoSuchTableError

        self.refuse_legacy(name)
        try:
            return self.catalog.load_table((NAMESPACE, name))
        except NoSuchTableError:
            return None

    def names(self) -> list[str]:
        return sorted(identifier[-1] for identifier in self.catalog.list_tables(NAMESPACE))

    def snapshot(self, name: str, snapshot_id: int | None = None, batch: str | None = None) -> TableSnapshot:
        """The data files of a snapshot (the current one by default), of one batch or all; none for a table
        never committed."""
        from pyiceberg.expressions import AlwaysTrue, EqualTo

        table = self.table(name)
        snap = None if table is None else table.snapshot_by_id(snapshot_id) if snapshot_id else table.current_snapshot()
        if snapshot_id and snap is None:
            raise TableMissingError(f"{NAMESPACE}.{name} has no snapshot {snapshot_id} (expired by `dgx-assets lake maintain`?)")
        if table is None or snap is None:
            return TableSnapshot(name, None, ())
        row_filter = EqualTo(PARTITION_COLUMN, batch) if batch is not None else AlwaysTrue()  # pyright: ignore[reportCallIssue]
        tasks = list(table.scan(row_filter=row_filter, snapshot_id=snap.snapshot_id).plan_files())
        if any(task.delete_files for task in tasks):  # never written here: commits drop whole files
            raise ValueError(f"{NAMESPACE}.{name} has delete files: read it through pyiceberg or Spark's Iceberg runtime")
        uris = tuple(sorted(task.file.file_path for task in tasks))  # Iceberg locations, as Spark reads them
        filesystem, _ = filesystem_for(from_location(uris[0] if uris else table.location()))
        return TableSnapshot(name, snap.snapshot_id, uris, filesystem, tuple(location_path(uri) for uri in uris))

    def require(self, name: str, batch: str | None = None, snapshot_id: int | None = None) -> TableSnapshot:
        """`snapshot`, refusing a table or batch without data files, with what to materialize."""
        found = self.snapshot(name, snapshot_id, batch)
        if not found.uris:
            what = f"{name} for batch {batch!r}" if batch is not None else name
            raise TableMissingError(
                f"the table {NAMESPACE}.{name} holds no data{' for ' + repr(batch) if batch else ''}: materialize {what} first"
            )
        return found

    def spark_frame(self, session: Any, name: str, batch: str | None = None, snapshot_id: int | None = None):
        """The rows of a snapshot as a Spark DataFrame, read from exactly its data files (where the cluster has
        Iceberg's Spark runtime, `spark.read.format("iceberg")` through the same catalog reads the same rows)."""
        # mergeSchema: files of an older version lack the columns a later one added (schema evolution).
        return session.read.option("mergeSchema", "true").parquet(*self.require(name, batch, snapshot_id).uris)

    def partitions(self, name: str, snapshot_id: int | None = None) -> list[str]:
        """The batches that have rows in a snapshot (the current one by default)."""
        table = self.table(name)
        if table is None or table.current_snapshot() is None:
            return []
        rows = table.inspect.partitions(snapshot_id=snapshot_id).to_pylist()
        return sorted(str(row["partition"][PARTITION_COLUMN]) for row in rows if row["record_count"])

    def scan(
        self, name: str, columns: Sequence[str] | None = None, row_filter: Any = None, snapshot_id: int | None = None
    ) -> pa.Table | None:
        """A pyiceberg scan (the driver's and the report's reads), or None for a table never committed."""
        from pyiceberg.expressions import AlwaysTrue

        table = self.table(name)
        if table is None or table.current_snapshot() is None:
            return None
        scan = table.scan(
            row_filter=row_filter if row_filter is not None else AlwaysTrue(),
            selected_fields=tuple(columns) if columns else ("*",),
            snapshot_id=snapshot_id,
        )
        return scan.to_arrow()

    def history(self, name: str) -> list[dict]:
        """Every snapshot of a table, oldest first: id, time, operation, the Dagster run, the rows added."""
        table = self.table(name)
        if table is None:
            return []
        rows = []
        for snap in table.snapshots():
            summary = snap.summary.additional_properties if snap.summary else {}
            rows.append(
                {
                    "snapshot_id": snap.snapshot_id,
                    "committed_at": dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, dt.UTC).isoformat(timespec="seconds"),
                    "operation": snap.summary.operation.value if snap.summary else None,
                    "dagster_run_id": summary.get(RUN_PROPERTY),
                    "total_records": summary.get("total-records"),
                }
            )
        return rows

    # --- writing ------------------------------------------------------------------------------------
    def files_uri(self, name: str, schema: pa.Schema, batch: str | None = None) -> str:
        """A new folder for one materialization's files, under the table's data location (the table is created
        from `schema` when it does not exist yet). Nothing lists it: files count only once committed. The batch
        is escaped (`partition_folder`): `lotA#retry` is a folder of its own, never `lotA`'s."""
        table = self._table_for(name, schema)
        data = posixpath.join(from_location(table.location()), "data")
        data = child_uri(data, partition_folder(batch)) if batch is not None else data  # quoted again, as a URI
        return f"{data}/{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"

    def commit(
        self, name: str, files: Sequence[str], batch: str | None = None, run_id: str | None = None, properties: dict | None = None
    ) -> int:
        """One transaction: drop the batch's rows (all rows of an unpartitioned table), add `files`. Returns the
        new snapshot's id. Redone on the fresh table when another writer committed first."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.expressions import AlwaysTrue, EqualTo

        if not files:
            raise ValueError(f"nothing to commit to {NAMESPACE}.{name}: no data files were written")
        properties = (properties or {}) | ({RUN_PROPERTY: run_id} if run_id else {})
        schema = _file_schema(self.lake, files[0])
        for attempt in range(COMMIT_ATTEMPTS):
            table = self._table_for(name, schema)
            transaction = table.transaction()
            if schema.names != table.schema().as_arrow().names:
                with transaction.update_schema() as update:  # a later version may add columns, never drop them
                    update.union_by_name(schema)
            with warnings.catch_warnings():  # the first version of a batch deletes nothing, and pyiceberg says so
                warnings.simplefilter("ignore", UserWarning)
                transaction.delete(
                    EqualTo(PARTITION_COLUMN, batch) if batch is not None else AlwaysTrue(),  # pyright: ignore[reportCallIssue]
                    snapshot_properties=properties,
                )
            locations = [to_location(file) for file in files]  # as Iceberg names a file: its path unquoted
            transaction.add_files(locations, snapshot_properties=properties, check_duplicate_files=False)
            try:
                committed = transaction.commit_transaction()
            except CommitFailedException:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(min(5.0, 0.1 * 2**attempt) * (1 + random.random()))
                continue
            snapshot = committed.current_snapshot()
            assert snapshot is not None  # a committed transaction always has a current snapshot
            return snapshot.snapshot_id
        raise AssertionError("unreachable")

    def write_and_commit(
        self,
        name: str,
        schema: pa.Schema,
        write: Callable[[str], list[str]],
        batch: str | None = None,
        run_id: str | None = None,
        properties: dict | None = None,
    ) -> int:
        """The whole protocol of one materialization: `write(folder)` writes the files into a new folder and
        returns them, then one commit. A failed write, or a commit that surely did not land, deletes the files
        written into the folder, and the folder; nothing is committed. Returns the new snapshot's id."""
        from pyiceberg.exceptions import CommitFailedException

        folder = self.files_uri(name, schema, batch)
        fs, path = filesystem_for(folder)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:  # never share a folder: its files would be deleted
            raise FileExistsError(f"{folder} exists already: a materialization writes into a new folder of its own")
        try:
            files = write(folder)
        except BaseException:
            self.discard(folder)
            raise
        try:
            return self.commit(name, files, batch, run_id, properties)
        except (CommitFailedException, ValueError):
            self.discard(folder)  # other errors leave the outcome unknown: the files stay for orphan maintenance
            raise

    def discard(self, folder_uri: str) -> None:
        """Delete the files a failed materialization wrote (its abort path): each file of its own new folder, by
        name, then the folder once empty. Nothing outside that folder is touched, nor a folder another run made
        (a writer's `_temporary` or hidden files are the run's own too)."""
        fs, path = filesystem_for(folder_uri)
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return
        for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
            if info.type == pafs.FileType.File:
                fs.delete_file(info.path)
        folders = [info.path for info in fs.get_file_info(pafs.FileSelector(path, recursive=True))]
        for folder in sorted(folders, key=len, reverse=True) + [path]:
            if not fs.get_file_info(pafs.FileSelector(folder)):  # empty: deleting it deletes no file
                fs.delete_dir(folder)

    def _table_for(self, name: str, schema: pa.Schema) -> Table:
        from pyiceberg.exceptions import TableAlreadyExistsError

        table = self.table(name)
        if table is not None:
            return table
        try:
            table = self.catalog.create_table((NAMESPACE, name), schema=schema)
            if PARTITION_COLUMN in schema.names and name not in UNPARTITIONED_TABLES:
                with table.update_spec() as spec:
                    spec.add_identity(PARTITION_COLUMN)
        except TableAlreadyExistsError:  # another process created it first
            pass
        return self.catalog.load_table((NAMESPACE, name))

    # --- the layout of before Iceberg ----------------------------------------------------------------
    def legacy_files(self, name: str) -> list[str]:
        """Parquet files of a table in the folder layout (`<lake>/<name>/batch=<key>/`, or the folder's top for
        ernie_generated_images), which `dgx-assets lake migrate` converts."""
        folder = self.lake.fs_path(self.lake.uri(name))
        if name in UNPARTITIONED_TABLES:
            return visible_files(self.lake.fs, folder, ".parquet", recursive=False)
        return [path for path in visible_files(self.lake.fs, folder, ".parquet") if f"/{PARTITION_COLUMN}=" in path]

    def refuse_legacy(self, name: str) -> None:
        """Once per process and table: a recursive listing per open would be a namenode listing on HDFS each time."""
        checked = (self.lake.root, name)
        if self.allow_legacy or name not in TABLES or checked in _LAYOUT_CHECKED:
            return
        if not self.legacy_files(name):
            _LAYOUT_CHECKED.add(checked)
            return
        raise LegacyLayoutError(
            f"{self.lake.uri(name)} is a table in the folder layout of before Iceberg: run `dgx-assets lake migrate` "
            "once (it converts every such table of the lake into an Iceberg table, batch by batch), then run again"
        )


def _file_schema(lake: Lake, uri: str) -> pa.Schema:
    import pyarrow.parquet as pq

    fs, path = filesystem_for(uri)
    with fs.open_input_file(path) as handle:
        return pq.ParquetFile(handle).schema_arrow
