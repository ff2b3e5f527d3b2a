"""Lake maintenance and migration on a lake that is not as they left it: links, edited metadata, an emptied
catalog, a writer committing meanwhile, stray files beside the old layout (real files, a real sqlite catalog)."""

import datetime as dt
import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.lake_tables import commit_rows, read_rows

from dgx_assets import cli
from dgx_assets.lake.maintenance import MaintenanceRefused, delete_orphans, list_orphans, maintain
from dgx_assets.lake.store import Lake

OLD = time.time() - 30 * 24 * 3600


def loaded(lake: Lake, name: str = "raw_images"):
    table = lake.tables.table(name)
    assert table is not None
    return table


def rows(batch: str, version: int, count: int = 3) -> pa.Table:
    return pa.table({"path": [f"{batch}/{i}.png" for i in range(count)], "batch": [batch] * count, "version": [version] * count})


def age(*folders) -> None:
    """Make every file and folder under `folders` a month old (older than any age bound), links untouched."""
    for top in folders:
        for folder, dirs, names in os.walk(top):
            for name in names + dirs:
                path = os.path.join(folder, name)
                if not os.path.islink(path):
                    os.utime(path, (OLD, OLD))


def outside_files(tmp_path, name: str = "outside"):
    folder = tmp_path / name
    folder.mkdir()
    for part in ("a.parquet", "notes.txt"):
        (folder / part).write_bytes(b"not the lake's")
    age(folder)
    return folder


def location(lake: Lake, name: str = "raw_images") -> str:
    return loaded(lake, name).location().removeprefix("file://")


def test_a_link_inside_a_table_folder_is_skipped_and_what_it_points_at_survives(tmp_path):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    lake = Lake(str(lake_root))
    outside = outside_files(tmp_path)
    link = os.path.join(location(lake), "data", "linked")
    os.symlink(outside, link)
    os.symlink(outside / "a.parquet", os.path.join(location(lake), "data", "linked.parquet"))
    age(location(lake))
    report = maintain(lake, orphan_older_than=dt.timedelta(0))
    assert sorted(os.listdir(outside)) == ["a.parquet", "notes.txt"]
    assert f"file://{link}" in report["raw_images"]["skipped_links"]
    assert os.path.islink(link) and [r["version"] for r in read_rows(lake_root, "raw_images")] == [1] * 3


def _rewrite_metadata(lake: Lake, change) -> None:
    path = loaded(lake).metadata_location.removeprefix("file://")
    with open(path) as handle:
        metadata = json.load(handle)
    change(metadata)
    with open(path, "w") as handle:
        json.dump(metadata, handle)


def test_a_metadata_location_outside_the_tables_folder_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    lake = Lake(str(lake_root))
    stray = os.path.join(location(lake), "data", "killed-run.parquet")
    pq.write_table(rows("b1", 9), stray)
    outside = outside_files(tmp_path)
    age(location(lake))
    _rewrite_metadata(lake, lambda metadata: metadata.update(location=f"file://{outside}"))
    with pytest.raises(MaintenanceRefused, match="names the location"):
        maintain(Lake(str(lake_root)), orphan_older_than=dt.timedelta(0))
    assert cli.main(["lake", "--lake", str(lake_root), "maintain", "--orphan-older-than-days", "0"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "nothing was deleted" in err and "Traceback" not in err
    assert sorted(os.listdir(outside)) == ["a.parquet", "notes.txt"] and os.path.exists(stray)


def test_a_files_folder_outside_the_tables_png_folder_is_refused(tmp_path):
    from dgx_assets.lake.tables import FILES_FOLDER

    lake = Lake(str(tmp_path / "lake"))
    outside = outside_files(tmp_path)
    (outside / "sibling").mkdir()
    age(outside)

    def write(folder: str) -> list[str]:
        os.makedirs(folder.removeprefix("file://"))
        pq.write_table(pa.table({"id": ["a"]}), folder.removeprefix("file://") + "/part-0.parquet")
        return [f"{folder}/part-0.parquet"]

    lake.tables.write_and_commit(
        "ernie_generated_images", pa.schema([("id", pa.string())]), write, properties={FILES_FOLDER: f"file://{outside}/run"}
    )
    with pytest.raises(MaintenanceRefused, match=FILES_FOLDER):
        maintain(lake, orphan_older_than=dt.timedelta(0))
    assert (outside / "sibling").is_dir()


def test_an_emptied_catalog_then_a_commit_refuses_maintenance_and_keeps_the_earlier_batches(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    commit_rows(lake_root, "raw_images", rows("b2", 1), "b2")
    earlier = location(Lake(str(lake_root)))
    age(earlier)
    before = sorted(os.path.join(folder, name) for folder, _, names in os.walk(earlier) for name in names)
    (lake_root / "iceberg_catalog.db").write_bytes(b"")  # a bad copy, a full disk
    commit_rows(lake_root, "raw_images", rows("b3", 1), "b3")  # a fresh table at the same place
    assert cli.main(["lake", "--lake", str(lake_root), "maintain", "--orphan-older-than-days", "0"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "another table" in err and "register_table" in err
    assert all(os.path.exists(path) for path in before)


def test_an_emptied_catalog_refuses_maintenance_until_lake_register_puts_the_tables_back(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    commit_rows(lake_root, "image_features", rows("b1", 2), "b1")
    age(lake_root / "warehouse")
    (lake_root / "iceberg_catalog.db").write_bytes(b"")
    with pytest.raises(MaintenanceRefused, match="does not know the table dgx.image_features.*lake register image_features"):
        maintain(Lake(str(lake_root)), orphan_older_than=dt.timedelta(0))
    assert cli.main(["lake", "--lake", str(lake_root), "register"]) == 0
    assert "dgx.raw_images: registered from" in capsys.readouterr().out
    maintain(Lake(str(lake_root)), orphan_older_than=dt.timedelta(0))
    assert [r["version"] for r in read_rows(lake_root, "raw_images")] == [1] * 3
    assert [r["version"] for r in read_rows(lake_root, "image_features")] == [2] * 3


def test_a_snapshot_committed_between_the_listing_and_the_deletion_keeps_its_files(tmp_path):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    lake = Lake(str(lake_root))
    listings = []

    def write(folder: str) -> list[str]:  # a writer whose files are on disk when maintenance lists the folder
        os.makedirs(folder.removeprefix("file://"))
        pq.write_table(rows("b2", 2), folder.removeprefix("file://") + "/part-0.parquet")
        age(location(lake))
        listings.append(list_orphans(lake, loaded(lake), "raw_images", dt.timedelta(0)))
        return [f"{folder}/part-0.parquet"]

    lake.tables.write_and_commit("raw_images", rows("b2", 2).schema, write, "b2")
    assert any(entry.uri.endswith("/part-0.parquet") for entry in listings[0].candidates)
    assert delete_orphans(lake, listings[0]) == []
    assert sorted(r["version"] for r in read_rows(lake_root, "raw_images")) == [1] * 3 + [2] * 3


def test_a_file_another_table_references_is_not_an_orphan_of_the_folder_it_lies_in(tmp_path):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    lake = Lake(str(lake_root))
    shared = os.path.join(location(lake), "data", "shared.parquet")
    pq.write_table(rows("b1", 5), shared)
    lake.tables.commit("image_features", [f"file://{shared}"], "b1")
    age(lake_root / "warehouse")
    maintain(lake, orphan_older_than=dt.timedelta(0))
    assert os.path.exists(shared) and [r["version"] for r in read_rows(lake_root, "image_features")] == [5] * 3


def test_snapshot_expiry_is_redone_when_a_writer_committed_first(tmp_path, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update.snapshot import ExpireSnapshots

    lake_root = tmp_path / "lake"
    for version in range(3):
        commit_rows(lake_root, "raw_images", rows("b1", version), "b1")
    commit = ExpireSnapshots.commit
    failures = []

    def losing_once(self):
        if not failures:
            failures.append(1)
            raise CommitFailedException("another writer committed first")
        return commit(self)

    monkeypatch.setattr(ExpireSnapshots, "commit", losing_once)
    count = len(loaded(Lake(str(lake_root))).snapshots())
    report = maintain(Lake(str(lake_root)), expire_older_than=dt.timedelta(0), retain_last=2)
    assert failures and len(report["raw_images"]["expired_snapshots"]) == count - 2
    assert [r["version"] for r in read_rows(lake_root, "raw_images")] == [2] * 3


def test_migrate_converts_only_batch_folders_parquet_and_leaves_the_rest_in_place(tmp_path, capsys):
    lake_root = tmp_path / "lake"
    table = lake_root / "raw_images"
    (table / "batch=b1").mkdir(parents=True)
    pq.write_table(rows("b1", 0).drop_columns(["batch"]), table / "batch=b1" / "part-00000.parquet")
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(rows("zz", 0).drop_columns(["batch"]), outside / "o.parquet")
    left = {
        "notes.txt": lambda p: p.write_text("notes"),
        "loose.parquet": lambda p: pq.write_table(rows("x", 0), p),
        "_archive": lambda p: (p.mkdir(), pq.write_table(rows("a", 0), p / "a.parquet")),
        "batch=b1/.p.parquet": lambda p: pq.write_table(rows("b1", 7), p),
        "batch=c": lambda p: p.write_text("a file named like a batch"),
        "batch=d/x.parquet": lambda p: (p.mkdir(parents=True), pq.write_table(rows("d", 0), p / "part-0.parquet")),
        "batch=b1/link.parquet": lambda p: os.symlink(outside / "o.parquet", p),
        "batch=e": lambda p: os.symlink(outside, p),
    }
    for relative, make in left.items():
        make(table / relative)
    assert cli.main(["lake", "--lake", str(lake_root), "migrate"]) == 0
    out = capsys.readouterr().out
    for relative in left:
        assert os.path.lexists(table / relative), relative
        assert f"left in place, not converted: file://{table / relative}" in out, relative
    assert not (table / "batch=b1" / "part-00000.parquet").exists() and (outside / "o.parquet").exists()
    lake = Lake(str(lake_root))
    lake.tables.allow_legacy = True  # the files left look like the old layout: opening the table still refuses
    assert lake.tables.partitions("raw_images") == ["b1"]
    assert sorted(pa.Table.column(lake.tables.scan("raw_images"), "path").to_pylist()) == [f"b1/{i}.png" for i in range(3)]
