"""The lake's atomic replace, for partitioned and whole-asset folders, and recovery after a killed commit."""

import pytest

from dgx_assets.lake import Lake


def test_commit_replaces_a_partition_and_leaves_nothing_hidden(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for version in (b"one", b"two"):
        staging = lake.staging_uri("table", "b1")
        lake.write_bytes(staging + "/part-0.parquet", version)
        lake.commit(staging, lake.asset_uri("table", "b1"))
    assert lake.read_bytes(lake.asset_uri("table", "b1") + "/part-0.parquet") == b"two"
    assert lake.partitions("table") == ["b1"]
    assert sorted(p.name for p in (tmp_path / "lake" / "table").iterdir()) == ["batch=b1"]


def test_commit_replaces_a_whole_asset_folder(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for version in (b"v1", b"v2"):
        staging = lake.staging_uri("model")
        lake.write_bytes(staging + "/model.bin", version)
        lake.commit(staging, lake.asset_uri("model"))
    assert lake.read_bytes(lake.uri("model", "model.bin")) == b"v2"
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == ["model"]


def test_a_commit_killed_between_its_renames_leaves_the_old_version_recoverable(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    staging = lake.staging_uri("table", "b1")
    lake.write_bytes(staging + "/part-0.parquet", b"old")
    lake.commit(staging, lake.asset_uri("table", "b1"))
    # Simulate the kill: the old version moved aside, the new one never moved in.
    (tmp_path / "lake" / "table" / "batch=b1").rename(tmp_path / "lake" / "table" / ".batch=b1.previous-deadbeef")
    assert lake.partitions("table") == ["b1"]  # listing puts it back
    assert lake.read_bytes(lake.asset_uri("table", "b1") + "/part-0.parquet") == b"old"


def test_plain_paths_and_uris_name_the_same_place(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    assert lake.root == (tmp_path / "lake").as_uri()
    assert lake.fs_path(lake.uri("a", "b")) == str(tmp_path / "lake" / "a" / "b")
    assert Lake((tmp_path / "lake").as_uri() + "/").root == lake.root
    assert lake.uri_of(lake.fs_path(lake.uri("a", "b c#1"))) == lake.uri("a", "b c#1")  # and back
    assert lake.uri_of(lake.fs_path(lake.root)) == lake.root
    with pytest.raises(ValueError, match="not under the lake's root"):
        lake.uri_of(str(tmp_path / "lake-other" / "x"))


def test_data_files_skip_hidden_and_underscore_names_and_can_stay_at_the_top(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    table = lake.asset_uri("generated")
    for name in (
        "part-0.parquet",
        "part-1.parquet",
        "_SUCCESS",
        ".part-0.parquet.crc",
        "png/a.png",
        "batch=b1/part-2.parquet",
        "_temporary/part-9.parquet",
    ):
        lake.write_bytes(f"{table}/{name}", b"x")
    top = lake.data_files(table, recursive=False)
    assert [path.rsplit("/", 1)[1] for path in top] == ["part-0.parquet", "part-1.parquet"]
    every = lake.data_files(table)
    assert [path.rsplit("/", 2)[-2:] for path in every] == [
        ["batch=b1", "part-2.parquet"],
        ["generated", "part-0.parquet"],
        ["generated", "part-1.parquet"],
    ]
    assert lake.data_files(lake.asset_uri("missing")) == []


def test_files_written_into_a_dropped_staging_folder_are_swept_next_time(tmp_path):
    """A failed run deletes its staging folder, then its executors' last PNGs re-create it."""
    lake = Lake(str(tmp_path / "lake"))
    failed = lake.staging_uri("generated")
    lake.write_bytes(failed + "/png/a.png", b"png")
    lake.drop_staging(failed)
    lake.write_bytes(failed + "/png/late.png", b"written after the driver gave up")
    staging = lake.staging_uri("generated")
    lake.write_bytes(staging + "/part-0.parquet", b"v2")
    lake.commit(staging, lake.asset_uri("generated"))
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == ["generated"]


def test_another_hosts_staging_is_swept_only_when_old(tmp_path):
    import os
    import time

    lake = Lake(str(tmp_path / "lake"))
    names = {age: f".staging-batch=b{age}-0123456789ab-p1s1hffffffff" for age in ("old", "young")}
    for name in names.values():
        (tmp_path / "lake" / "table" / name).mkdir(parents=True)
    old = time.time() - 3 * 24 * 3600
    os.utime(tmp_path / "lake" / "table" / names["old"], (old, old))
    assert lake.partitions("table") == []
    assert sorted(p.name for p in (tmp_path / "lake" / "table").iterdir()) == [names["young"]]
