"""Executors write a table's Parquet files; the driver then commits them to the Iceberg table (dgx_assets/lake/tables.py).

Two writers, measured against each other by bench/ingest.py (BENCHMARKS.md, 1):
- `arrow` (the default): a pyspark Python data source (`DataSourceArrowWriter`). Each task's Python worker writes
  its Arrow batches into one Parquet file with pyarrow and returns the file's URI to the driver as its commit
  message; Spark's commit protocol calls `commit` with the messages of the successful attempts only (a failed or
  speculative attempt's file is not among them, and is deleted there), or `abort`.
- `spark`: Spark's own Parquet writer (the JVM's row-based writer and its output committer).
Both write the table's columns, the partition column included: Iceberg reads a file's partition from its values.
"""

from __future__ import annotations

import base64
import json
import posixpath
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from dgx_assets.lake.files import filesystem_for, path_of, to_location, visible_files, worker_filesystem
from dgx_assets.spark.parquet import ROW_GROUP_BYTES, image_table_options

WRITERS = ("arrow", "spark")
SOURCE_NAME = "dgx_lake_parquet"
COMMITTED_FILE = "_committed.json"  # the arrow writer's committed files, listed by its driver-side commit
# The SparkSessions the data source is registered with. Weak, and by the session itself, not its id(): a
# stopped session's object goes, and the next run's session may get its address, but not its registration.
_REGISTERED: weakref.WeakSet = weakref.WeakSet()


def write_table_files(
    frame,
    folder_uri: str,
    schema: pa.Schema,
    blob_columns: tuple[str, ...] = (),
    compression: str = "zstd",
    writer: str = "arrow",
) -> list[str]:
    """Write `frame` (of `schema`) as Parquet files into the new folder `folder_uri` (a lake URI, quoted as
    URIs are); returns the files' URIs."""
    if writer not in WRITERS:
        raise ValueError(f"writer={writer!r} is not one of {', '.join(WRITERS)}")
    if writer == "spark":
        frame.write.mode("errorifexists").options(**image_table_options(*blob_columns, compression=compression)).parquet(
            to_location(folder_uri)  # Hadoop takes a path as it is: `%20` would be three characters of a name
        )
        fs, path = filesystem_for(folder_uri)
        return [f"{folder_uri}/{posixpath.basename(file)}" for file in visible_files(fs, path, ".parquet")]
    session = frame.sparkSession
    if session not in _REGISTERED:  # once per session: registering again makes Spark log a warning
        session.dataSource.register(LakeParquetSource)
        _REGISTERED.add(session)
    options = {
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
        "blob_columns": ",".join(blob_columns),
        "compression": compression,
    }
    frame.write.format(SOURCE_NAME).mode("append").options(**options).save(folder_uri)
    fs, path = filesystem_for(folder_uri)
    with fs.open_input_stream(f"{path}/{COMMITTED_FILE}") as stream:
        return json.loads(stream.read())


def write_parquet(fs, path: str, schema: pa.Schema, batches, blob_columns=(), compression: str = "zstd") -> int:
    """Write `batches` (cast to `schema`) into one Parquet file in row groups of about ROW_GROUP_BYTES, without
    dictionary or statistics on the image columns (spark/parquet.py says why). Returns the rows written."""
    import pyarrow.parquet as pq

    others = [name for name in schema.names if name not in blob_columns]
    rows, pending, pending_bytes = 0, [], 0
    with (
        fs.open_output_stream(path) as out,
        pq.ParquetWriter(
            out,
            schema,
            compression=compression,
            # pyarrow takes a bool or a column list; pyright guesses bool from the unannotated defaults
            use_dictionary=others,  # pyright: ignore[reportArgumentType]
            write_statistics=others,  # pyright: ignore[reportArgumentType]
            store_schema=False,
        ) as parquet,
    ):
        for batch in batches:
            batch = batch.select(schema.names).cast(schema) if batch.schema != schema else batch
            pending.append(batch)
            pending_bytes += batch.nbytes
            rows += batch.num_rows
            if pending_bytes >= ROW_GROUP_BYTES:
                parquet.write_table(pa.Table.from_batches(pending, schema), row_group_size=sum(b.num_rows for b in pending))
                pending, pending_bytes = [], 0
        if pending:
            parquet.write_table(pa.Table.from_batches(pending, schema), row_group_size=sum(b.num_rows for b in pending))
    return rows


# --- the Python data source (its classes run in Spark's Python workers) --------------------------------------

try:  # pyspark is there wherever Spark runs; the module stays importable without it (migration, tests)
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
except ImportError:  # pragma: no cover
    DataSource = DataSourceArrowWriter = WriterCommitMessage = object


@dataclass
class FileWritten(WriterCommitMessage):  # pyright: ignore[reportGeneralTypeIssues]
    uri: str | None  # None: the task had no rows


class LakeParquetSource(DataSource):  # pyright: ignore[reportGeneralTypeIssues]
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def writer(self, schema, overwrite: bool):
        return LakeParquetWriter(self.options)


class LakeParquetWriter(DataSourceArrowWriter):  # pyright: ignore[reportGeneralTypeIssues]
    def __init__(self, options: dict):
        self.folder = options["path"].rstrip("/")
        self.schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(options["schema"])))
        self.blob_columns = tuple(filter(None, options.get("blob_columns", "").split(",")))
        self.compression = options.get("compression", "zstd")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FileWritten:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None  # write() runs inside a Spark task
        uri = f"{self.folder}/part-{context.partitionId():05d}-{context.attemptNumber()}-{uuid.uuid4().hex[:8]}.parquet"
        fs, path = worker_filesystem(uri), path_of(uri)
        fs.create_dir(posixpath.dirname(path), recursive=True)
        try:
            rows = write_parquet(fs, path, self.schema, iterator, self.blob_columns, self.compression)
        except BaseException:
            fs.delete_file(path)  # a failed attempt leaves nothing behind; Spark retries the task
            raise
        if not rows:
            fs.delete_file(path)
            return FileWritten(None)
        return FileWritten(uri)

    def commit(self, messages: list[FileWritten]) -> None:
        """Driver side: the successful attempts' files, for the driver's Iceberg commit; any other file in the
        folder (a speculative attempt that lost) is deleted."""
        kept = sorted(message.uri for message in messages if message is not None and message.uri)
        fs, path = filesystem_for(self.folder)
        for file in visible_files(fs, path, ".parquet"):
            if f"{self.folder}/{posixpath.basename(file)}" not in kept:
                fs.delete_file(file)
        with fs.open_output_stream(f"{path}/{COMMITTED_FILE}") as out:
            out.write(json.dumps(kept).encode())

    def abort(self, messages: list[FileWritten]) -> None:
        """Driver side: delete the files the successful attempts wrote, by name (a failed attempt deleted its
        own); the folder and anything else in it are left to the caller's abort path."""
        fs = worker_filesystem(self.folder)
        for message in messages:
            if message is not None and message.uri:
                path = path_of(message.uri)
                if fs.get_file_info(path).type == pafs.FileType.File:
                    fs.delete_file(path)
