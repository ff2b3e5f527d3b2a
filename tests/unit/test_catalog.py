"""The lake's Iceberg tables on a real pyiceberg SQL catalog (sqlite) and real Parquet files: partition commits,
time travel, schema evolution, failed writes, maintenance, the migration of the folder layout."""

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.lake_tables import commit_rows, read_rows

from dgx_assets import cli, settings
from dgx_assets.lake.maintenance import expire_snapshots, maintain, remove_orphan_files
from dgx_assets.lake.migration import migrate
from dgx_assets.lake.store import Lake
from dgx_assets.lake.tables import LegacyLayoutError, catalog_properties


def rows(batch: str, version: int, count: int = 3, **extra) -> pa.Table:
    columns = {"path": [f"{batch}/{i}.png" for i in range(count)], "batch": [batch] * count, "version": [version] * count}
    return pa.table(columns | {name: [value] * count for name, value in extra.items()})


def test_one_setting_picks_the_catalog_kind(tmp_path, monkeypatch):
    assert catalog_properties("sqlite:////x/c.db", "file:///w")["type"] == "sql"
    assert catalog_properties("postgresql+psycopg2://u@db/iceberg", "hdfs://nn:8020/w")["type"] == "sql"
    assert catalog_properties("https://catalog.example/api", "hdfs://nn:8020/w")["type"] == "rest"
    assert catalog_properties("thrift://metastore:9083", "hdfs://nn:8020/w")["type"] == "hive"
    with pytest.raises(ValueError, match="DGX_CATALOG_URI='ftp://x'"):
        catalog_properties("ftp://x", "file:///w")
    # Default: a sqlite file beside a local lake; under the state folder for a remote one.
    env = settings.environment()
    assert env.with_lake(str(tmp_path / "lake")).catalog_uri == f"sqlite:///{tmp_path / 'lake' / 'iceberg_catalog.db'}"
    assert env.with_lake("hdfs://nn:8020/lake").catalog_uri == f"sqlite:///{env.state_dir / 'iceberg_catalog.db'}"
    assert env.with_lake("hdfs://nn:8020/lake").catalog_warehouse == "hdfs://nn:8020/lake/warehouse"
    monkeypatch.setenv("DGX_CATALOG_URI", "thrift://metastore:9083")
    assert settings.environment().with_lake(str(tmp_path)).catalog_uri == "thrift://metastore:9083"


def test_a_webhdfs_warehouse_is_refused_with_what_to_set(tmp_path):
    lake = Lake(str(tmp_path / "lake"), warehouse="webhdfs://namenode:9870/lake/warehouse")
    with pytest.raises(ValueError, match="pyiceberg's file IO cannot write .*DGX_CATALOG_WAREHOUSE"):
        lake.tables.snapshot("raw_images")


def test_a_commit_replaces_one_batch_and_time_travel_reads_the_old_version(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    first = commit_rows(lake_root, "raw_images", rows("b1", 1, count=5), "b1")
    commit_rows(lake_root, "raw_images", rows("b2", 1), "b2")
    commit_rows(lake_root, "raw_images", rows("b1", 2, count=2), "b1")
    now = read_rows(lake_root, "raw_images")
    assert sorted((r["batch"], r["version"]) for r in now) == [("b1", 2)] * 2 + [("b2", 1)] * 3
    assert [r["version"] for r in read_rows(lake_root, "raw_images", "b1", snapshot_id=first)] == [1] * 5
    tables = Lake(str(lake_root)).tables
    assert tables.partitions("raw_images") == ["b1", "b2"] and tables.partitions("raw_images", first) == ["b1"]
    assert (lake_root / "warehouse" / "dgx" / "raw_images" / "metadata").is_dir()
    # The documented command: the rows of one snapshot into a Parquet file.
    out = tmp_path / "b1-v1.parquet"
    cli.main(["lake", "--lake", str(lake_root), "export", "raw_images", "--snapshot", str(first), "--out", str(out)])
    assert pq.read_table(out).column("version").to_pylist() == [1] * 5
    cli.main(["lake", "--lake", str(lake_root), "snapshots"])
    listing = capsys.readouterr().out
    assert "dgx.raw_images" in listing and str(first) in listing


def test_exporting_a_table_the_lake_does_not_have_says_so(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    out = tmp_path / "x.parquet"
    assert cli.main(["lake", "--lake", str(lake_root), "export", "raw_imagez", "--snapshot", "1", "--out", str(out)]) == 2
    said = capsys.readouterr()
    assert said.err.startswith("dgx-assets lake export: dgx.raw_imagez does not exist or has no snapshot yet")
    assert said.out == "" and not out.exists()


def test_a_later_version_may_add_a_column(tmp_path):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    commit_rows(lake_root, "raw_images", rows("b2", 2, camera="cam-7"), "b2")
    by_batch = {r["batch"]: r for r in read_rows(lake_root, "raw_images")}
    assert by_batch["b2"]["camera"] == "cam-7" and by_batch["b1"]["camera"] is None
    assert "camera" in Lake(str(lake_root)).tables.table("raw_images").schema().column_names


def test_a_failed_write_commits_nothing_and_removes_its_files(tmp_path):
    lake_root = tmp_path / "lake"
    before = commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    tables = Lake(str(lake_root)).tables
    written = []

    def failing(folder: str) -> list[str]:
        path = folder.removeprefix("file://")
        os.makedirs(path)
        pq.write_table(rows("b1", 2), f"{path}/part-0.parquet")
        written.append(path)
        raise RuntimeError("an executor died")

    with pytest.raises(RuntimeError, match="an executor died"):
        tables.write_and_commit("raw_images", rows("b1", 2).schema, failing, "b1")
    assert tables.table("raw_images").current_snapshot().snapshot_id == before
    assert not os.path.exists(written[0])
    assert {r["version"] for r in read_rows(lake_root, "raw_images")} == {1}


def test_maintenance_expires_old_snapshots_and_deletes_only_old_unreferenced_files(tmp_path):
    lake_root = tmp_path / "lake"
    lake = Lake(str(lake_root))
    ids = [commit_rows(lake_root, "raw_images", rows("b1", v), "b1") for v in range(4)]
    import datetime as dt

    assert expire_snapshots(lake, "raw_images", older_than=dt.timedelta(days=7)) == []  # all young: kept
    # A batch's commit is two snapshots (its delete, then its files): the last three keep two versions readable.
    expired = expire_snapshots(lake, "raw_images", older_than=dt.timedelta(0), retain_last=3)
    kept = {snap.snapshot_id for snap in lake.tables.table("raw_images").snapshots()}
    assert ids[0] in expired and {ids[-1], ids[-2]} <= kept and len(kept) == 3
    location = lake.tables.table("raw_images").location().removeprefix("file://")
    stray = os.path.join(location, "data", "batch=b1", "killed-run", "part-0.parquet")
    os.makedirs(os.path.dirname(stray))
    pq.write_table(rows("b1", 9), stray)
    assert remove_orphan_files(lake, "raw_images") == []  # young files: a run may still be writing them
    old = time.time() - 4 * 24 * 3600
    for folder, _, names in os.walk(location):
        for name in names:
            os.utime(os.path.join(folder, name), (old, old))
    report = maintain(lake, orphan_older_than=dt.timedelta(days=3))
    removed = report["raw_images"]["removed_files"]
    assert f"file://{stray}" in removed
    assert [r["version"] for r in read_rows(lake_root, "raw_images")] == [3] * 3  # the current version is whole
    assert {r["version"] for r in read_rows(lake_root, "raw_images", snapshot_id=ids[-2])} == {2}  # kept one too


def _legacy_lake(lake_root) -> None:
    for batch, count in (("b1", 4), ("b2", 2)):
        folder = lake_root / "raw_images" / f"batch={batch}"
        folder.mkdir(parents=True)
        pq.write_table(rows(batch, 0, count).drop_columns(["batch"]), folder / "part-00000.parquet")
    (lake_root / "ernie_generated_images" / "png").mkdir(parents=True)
    (lake_root / "ernie_generated_images" / "png" / "a.png").write_bytes(b"png")
    pq.write_table(pa.table({"id": ["a"], "png_path": ["x/png/a.png"]}), lake_root / "ernie_generated_images" / "part-0.parquet")


def test_a_folder_layout_lake_is_refused_until_migrated_then_read_as_iceberg(tmp_path):
    lake_root = tmp_path / "lake"
    _legacy_lake(lake_root)
    with pytest.raises(LegacyLayoutError, match="dgx-assets lake migrate"):
        Lake(str(lake_root)).tables.snapshot("raw_images")
    assert cli.main(["lake", "--lake", str(lake_root), "migrate"]) == 0
    migrated = read_rows(lake_root, "raw_images")
    assert sorted(r["path"] for r in migrated) == sorted([f"b1/{i}.png" for i in range(4)] + [f"b2/{i}.png" for i in range(2)])
    assert {r["batch"] for r in migrated if r["path"].startswith("b2/")} == {"b2"}
    assert Lake(str(lake_root)).tables.partitions("raw_images") == ["b1", "b2"]
    assert [r["id"] for r in read_rows(lake_root, "ernie_generated_images")] == ["a"]
    assert not (lake_root / "raw_images").exists() and not list((lake_root / "ernie_generated_images").glob("*.parquet"))
    assert (lake_root / "ernie_generated_images" / "png" / "a.png").exists()  # the rows' png_path still holds
    assert migrate(Lake(str(lake_root))) == {}  # nothing left to convert: nothing is read twice


def test_the_folder_layout_is_looked_for_once_per_process_and_table_not_on_every_open(tmp_path):
    lake_root = tmp_path / "lake"
    tables = Lake(str(lake_root)).tables
    assert tables.snapshot("raw_images").snapshot_id is None  # looked for, none found
    _legacy_lake(lake_root)  # appears later: the recursive listing is not repeated for raw_images...
    assert Lake(str(lake_root)).tables.snapshot("raw_images").snapshot_id is None
    with pytest.raises(LegacyLayoutError):  # ...but ernie_generated_images is looked at on its first open
        Lake(str(lake_root)).tables.snapshot("ernie_generated_images")


def test_maintenance_deletes_the_png_folders_no_kept_snapshot_names(tmp_path):
    import datetime as dt

    from dgx_assets.lake.tables import FILES_FOLDER

    lake = Lake(str(tmp_path / "lake"))
    folders = [lake.uri("ernie_generated_images", "png", f"run-{n}") for n in range(3)]
    for number, folder in enumerate(folders):
        lake.write_bytes(f"{folder}/a.png", b"png")

        def write(files_folder: str, number=number) -> list[str]:
            os.makedirs(files_folder.removeprefix("file://"))
            pq.write_table(pa.table({"id": ["a"], "version": [number]}), files_folder.removeprefix("file://") + "/part-0.parquet")
            return [f"{files_folder}/part-0.parquet"]

        lake.tables.write_and_commit(
            "ernie_generated_images", pa.schema([("id", pa.string())]), write, properties={FILES_FOLDER: folder}
        )
    old = time.time() - 4 * 24 * 3600
    for folder in folders:
        os.utime(folder.removeprefix("file://"), (old, old))
    # The second run's snapshot is kept (the last three snapshots hold runs 1 and 2): only run 0's folder goes.
    report = maintain(lake, expire_older_than=dt.timedelta(0), retain_last=3)
    assert folders[0] in report["ernie_generated_images"]["removed_files"]
    assert [os.path.exists(f.removeprefix("file://")) for f in folders] == [False, True, True]


class FakeHdfs:
    """HDFS cannot run here: this stands in for pyarrow's HadoopFileSystem (libhdfs), for both pyiceberg's file IO
    and the lake, serving the namenode's paths from the local disk (creating parent folders on write, as HDFS does)."""

    opened: list[str] = []

    @classmethod
    def from_uri(cls, uri: str):
        import pyarrow.fs as pafs

        class Handler(pafs.FSSpecHandler):
            def open_output_stream(self, path, metadata):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                return super().open_output_stream(path, metadata)

        import fsspec

        cls.opened.append(uri)
        return pafs.PyFileSystem(Handler(fsspec.filesystem("file")))


def test_tables_on_an_hdfs_warehouse_go_through_pyarrows_hadoop_filesystem(tmp_path, monkeypatch):
    import pyarrow.fs as pafs

    monkeypatch.setattr(pafs, "HadoopFileSystem", FakeHdfs)
    lake_root = f"hdfs://namenode:8020{tmp_path}/lake"
    first = commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    commit_rows(lake_root, "raw_images", rows("b1", 2), "b1")
    tables = Lake(lake_root).tables
    assert tables.catalog_uri == f"sqlite:///{settings.environment().state_dir / 'iceberg_catalog.db'}"  # a remote lake's default
    snapshot = tables.snapshot("raw_images")
    assert snapshot.uris and all(
        uri.startswith(f"hdfs://namenode:8020{tmp_path}/lake/warehouse/dgx/raw_images/data/") for uri in snapshot.uris
    )
    assert tables.table("raw_images").metadata_location.startswith("hdfs://namenode:8020/")
    assert [r["version"] for r in read_rows(lake_root, "raw_images", "b1")] == [2] * 3
    assert [r["version"] for r in read_rows(lake_root, "raw_images", "b1", snapshot_id=first)] == [1] * 3
    assert set(FakeHdfs.opened) == {"hdfs://namenode:8020"}  # pyiceberg and the lake, one client per namenode
