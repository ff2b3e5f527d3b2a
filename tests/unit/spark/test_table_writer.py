"""The arrow table writer's Parquet files and its driver-side commit and abort (plain Python: no JVM)."""

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dgx_assets.spark.table_writer import COMMITTED_FILE, FileWritten, LakeParquetWriter, write_parquet

SCHEMA = pa.schema([("path", pa.string()), ("batch", pa.string()), ("content", pa.binary())])


def writer_for(folder) -> LakeParquetWriter:
    import base64

    return LakeParquetWriter(
        {"path": folder.as_uri(), "schema": base64.b64encode(SCHEMA.serialize().to_pybytes()).decode(), "blob_columns": "content"}
    )


def test_files_have_the_table_schema_and_no_statistics_on_image_columns(tmp_path):
    batches = [pa.record_batch({"path": ["a", "b"], "batch": ["b1", "b1"], "content": [b"x" * 10, b"y"]})]
    rows = write_parquet(pafs.LocalFileSystem(), str(tmp_path / "f.parquet"), SCHEMA, batches, ("content",))
    parquet = pq.ParquetFile(tmp_path / "f.parquet")
    assert rows == 2 and parquet.schema_arrow == SCHEMA
    column = {parquet.metadata.row_group(0).column(i).path_in_schema: parquet.metadata.row_group(0).column(i) for i in range(3)}
    assert column["batch"].statistics.has_min_max and column["content"].statistics is None  # Iceberg reads batch's


def test_commit_keeps_the_successful_attempts_files_and_abort_removes_only_them(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("part-00000-0.parquet", "part-00000-1.parquet", "part-00001-0.parquet"):
        pq.write_table(pa.table({"path": ["a"], "batch": ["b1"], "content": [b"x"]}), folder / name)
    writer = writer_for(folder)
    kept = [f"{folder.as_uri()}/part-00000-1.parquet", f"{folder.as_uri()}/part-00001-0.parquet"]
    writer.commit([FileWritten(kept[0]), FileWritten(None), FileWritten(kept[1])])  # a task without rows, and a loser
    assert sorted(p.name for p in folder.glob("*.parquet")) == ["part-00000-1.parquet", "part-00001-0.parquet"]
    assert json.loads((folder / COMMITTED_FILE).read_text()) == kept
    (folder / "someone-elses.parquet").write_bytes(b"not this run's")
    writer.abort([FileWritten(kept[0]), FileWritten(None), FileWritten(kept[1])])
    # The files the run wrote go, by name; the folder and what the run did not write stay (the caller's to drop).
    assert sorted(p.name for p in folder.iterdir()) == [COMMITTED_FILE, "someone-elses.parquet"]
