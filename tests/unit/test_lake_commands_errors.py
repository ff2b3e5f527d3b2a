"""Every `dgx-assets lake` command on a catalog or metadata file it cannot read, or an unknown table or snapshot:
one line on stderr and a non-zero exit, no traceback (unless --verbose)."""

import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.lake_tables import commit_rows

from dgx_assets import cli
from dgx_assets.lake.store import Lake


def loaded(lake: Lake, name: str = "raw_images"):
    table = lake.tables.table(name)
    assert table is not None
    return table


def rows(batch: str) -> pa.Table:
    return pa.table({"path": [f"{batch}/{i}.png" for i in range(3)], "batch": [batch] * 3})


def commands(lake_root, tmp_path) -> list[list[str]]:
    base = ["lake", "--lake", str(lake_root)]
    return [
        [*base, "snapshots"],
        [*base, "snapshots", "raw_images"],
        [*base, "export", "raw_images", "--snapshot", "1", "--out", str(tmp_path / "x.parquet")],
        [*base, "maintain"],
        [*base, "maintain", "--dry-run"],
        [*base, "register"],
    ]


def one_line_failure(argv, capsys, code: int | None = None) -> str:
    returned = cli.main(argv)
    out, err = capsys.readouterr()
    assert returned != 0 and (code is None or returned == code), (argv, returned, out, err)
    assert len(err.strip().splitlines()) == 1, (argv, err)
    assert "Traceback" not in out + err, argv
    return err


def test_a_truncated_metadata_file_is_one_line_per_command(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1"), "b1")
    metadata = loaded(Lake(str(lake_root))).metadata_location.removeprefix("file://")
    with open(metadata, "r+b") as handle:
        handle.truncate(len(handle.read()) // 2)
    for argv in commands(lake_root, tmp_path)[1:4]:
        assert metadata in one_line_failure(argv, capsys), argv


def test_a_garbage_metadata_file_is_one_line(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1"), "b1")
    metadata = loaded(Lake(str(lake_root))).metadata_location.removeprefix("file://")
    with open(metadata, "wb") as handle:
        handle.write(b'{"format-version": 2, "nonsense": true}')
    for argv in commands(lake_root, tmp_path)[:5]:  # `register` reads no table the catalog knows
        one_line_failure(argv, capsys)


def test_a_garbage_sqlite_catalog_is_one_line_per_command(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1"), "b1")
    (lake_root / "iceberg_catalog.db").write_bytes(b"garbage, not sqlite " * 500)
    for argv in commands(lake_root, tmp_path):
        assert "cannot be read" in one_line_failure(argv, capsys), argv
    with pytest.raises(Exception, match="not a database"):  # --verbose: the traceback
        cli.main(["lake", "--lake", str(lake_root), "snapshots", "--verbose"])


def test_a_locked_catalog_is_one_line(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1"), "b1")
    holder = sqlite3.connect(lake_root / "iceberg_catalog.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert "locked" in one_line_failure(["lake", "--lake", str(lake_root), "snapshots"], capsys)
    finally:
        holder.close()


def test_an_unknown_snapshot_or_table_is_one_line(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1"), "b1")
    out = tmp_path / "x.parquet"
    base = ["lake", "--lake", str(lake_root)]
    err = one_line_failure([*base, "export", "raw_images", "--snapshot", "12345", "--out", str(out)], capsys, 2)
    assert "has no snapshot 12345" in err and not out.exists()
    assert "no table dgx.raw_imagez" in one_line_failure([*base, "snapshots", "raw_imagez"], capsys, 2)
    assert "no table dgx.raw_imagez" in one_line_failure([*base, "register", "raw_imagez"], capsys)


def test_a_layout_migrate_cannot_read_is_one_line_and_changes_nothing(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    folder = lake_root / "raw_images" / "batch=b1"
    folder.mkdir(parents=True)
    pq.write_table(rows("b1").drop_columns(["batch"]), folder / "part-00000.parquet")
    (folder / "part-00001.parquet").write_bytes(b"not parquet")
    err = one_line_failure(["lake", "--lake", str(lake_root), "migrate"], capsys)
    assert "part-00001.parquet is not a Parquet file" in err
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
