"""The lake's files: URIs and paths, and the folder swap of the outputs that are not tables (model folders)."""

import os
import time

import pytest

from dgx_assets.lake.store import Lake


def _swap_in(lake: Lake, asset: str, name: str, data: bytes) -> None:
    staging = lake.staging_uri(asset)
    lake.write_bytes(f"{staging}/{name}", data)
    lake.swap_in(staging, lake.asset_uri(asset))


def test_swap_in_replaces_a_whole_asset_folder(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for version in (b"v1", b"v2"):
        _swap_in(lake, "model", "model.bin", version)
    assert lake.read_bytes(lake.uri("model", "model.bin")) == b"v2"
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == ["model"]


def test_a_swap_killed_between_its_renames_leaves_the_old_version_recoverable(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _swap_in(lake, "model", "model.bin", b"old")
    # Simulate the kill: the old version moved aside, the new one never moved in.
    (tmp_path / "lake" / "model").rename(tmp_path / "lake" / ".model.previous-deadbeef")
    _swap_in(lake, "report", "report.html", b"other asset")  # the next swap beside it puts the old one back
    assert lake.read_bytes(lake.uri("model", "model.bin")) == b"old"


def test_staging_folders_of_killed_swaps_are_swept_only_when_old(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for name in (".staging-model-old", ".staging-model-young"):
        (tmp_path / "lake" / name).mkdir(parents=True)
    old = time.time() - 4 * 24 * 3600
    os.utime(tmp_path / "lake" / ".staging-model-old", (old, old))
    assert lake.sweep_staging(3 * 24 * 3600) == [lake.uri(".staging-model-old")]
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == [".staging-model-young"]


def test_plain_paths_and_uris_name_the_same_place(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    assert lake.root == (tmp_path / "lake").as_uri()
    assert lake.fs_path(lake.uri("a", "b")) == str(tmp_path / "lake" / "a" / "b")
    assert Lake((tmp_path / "lake").as_uri() + "/").root == lake.root
    assert lake.uri_of(lake.fs_path(lake.uri("a", "b c#1"))) == lake.uri("a", "b c#1")  # and back
    assert lake.uri_of(lake.fs_path(lake.root)) == lake.root
    with pytest.raises(ValueError, match="not under the lake's root"):
        lake.uri_of(str(tmp_path / "lake-other" / "x"))
