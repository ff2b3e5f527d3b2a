"""Batch names are data, never path or URI syntax: on real files and a real pyiceberg SQL catalog, a batch whose
name holds `#`, `?`, `%`, a space or a non-ASCII letter is a partition of its own, written, read back and
replaced without touching another batch; a lake under a folder with a space and a `%` keeps its files inside
itself; a failed write removes only the files it wrote."""

import os
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.lake_tables import commit_rows, read_rows

from dgx_assets.ingest.landing import look, look_at_batch
from dgx_assets.lake.files import (
    batch_name,
    child_uri,
    from_location,
    partition_folder,
    partition_segment,
    partition_value,
    path_of,
    to_location,
)
from dgx_assets.lake.store import Lake

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def rows(batch: str, version: int, count: int = 3) -> pa.Table:
    return pa.table({"path": [f"{batch}/{i}.png" for i in range(count)], "batch": [batch] * count, "version": [version] * count})


def files_under(folder) -> set[str]:
    return {os.path.join(top, name) for top, _, names in os.walk(folder) for name in names}


@pytest.mark.parametrize("name", ["lotA", "lotA#retry", "lot 7", NFC, "50%", "a?b", "x/y", "a=b:c\\d", "tab\there", "%41"])
def test_one_function_pair_turns_a_batch_name_into_one_path_segment_and_back(name):
    segment = partition_segment(name)
    assert partition_value(segment) == name
    assert segment.isascii() and not set(segment) & set("#?/\\:= \t[]{}*"), segment
    assert partition_folder(name) == f"batch={segment}"
    assert partition_segment("lotA#retry") != partition_segment("lotA") and partition_segment("b_01-2.x~") == "b_01-2.x~"


def test_lake_uris_are_quoted_and_unquoted_once(tmp_path):
    folder = tmp_path / "my lake 50%"
    uri = folder.as_uri()
    assert path_of(uri) == str(folder) and path_of(child_uri(uri, "a?b#c")) == f"{folder}/a?b#c"
    assert to_location(uri) == f"file://{folder}" and from_location(to_location(uri)) == uri
    assert from_location(f"file:{folder}/x") == f"{uri}/x"


def test_a_batch_named_like_another_plus_a_fragment_leaves_the_other_untouched(tmp_path):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("lotA", 1, count=4), "lotA")
    data = lake_root / "warehouse"
    lota_files = files_under(data)
    lota_parquet = {path for path in lota_files if path.endswith(".parquet") and "/batch=lotA/" in path}
    assert lota_parquet
    commit_rows(lake_root, "raw_images", rows("lotA#retry", 1, count=2), "lotA#retry")
    assert lota_parquet <= files_under(data)  # lotA's committed files, each still there
    assert (
        sorted((r["batch"], r["version"]) for r in read_rows(lake_root, "raw_images"))
        == [("lotA", 1)] * 4 + [("lotA#retry", 1)] * 2
    )
    assert len(read_rows(lake_root, "raw_images", "lotA")) == 4
    tables = Lake(str(lake_root)).tables
    assert tables.partitions("raw_images") == ["lotA", "lotA#retry"]
    # Replacing the new batch drops its rows only.
    commit_rows(lake_root, "raw_images", rows("lotA#retry", 2, count=1), "lotA#retry")
    assert {r["version"] for r in read_rows(lake_root, "raw_images", "lotA#retry")} == {2}
    assert len(read_rows(lake_root, "raw_images", "lotA")) == 4 and lota_parquet <= files_under(data)
    assert tables.snapshot("raw_images", batch="lotA").dataset().count_rows() == 4


@pytest.mark.parametrize("name", ["lot 7", NFC, "50%", "a?b", "%41"])
def test_batch_names_that_are_uri_syntax_commit_and_read_back(tmp_path, name):
    lake_root = tmp_path / "lake"
    commit_rows(lake_root, "raw_images", rows("b1", 1), "b1")
    commit_rows(lake_root, "raw_images", rows(name, 1, count=2), name)
    assert [r["batch"] for r in read_rows(lake_root, "raw_images", name)] == [name] * 2
    snapshot = Lake(str(lake_root)).tables.snapshot("raw_images", batch=name)
    assert snapshot.dataset().to_table().column("batch").to_pylist() == [name] * 2
    assert all(f"/{partition_folder(name)}/" in path for path in snapshot.paths)


def test_a_lake_under_a_folder_with_a_space_and_a_percent_commits_inside_itself(tmp_path):
    lake_root = tmp_path / "my lake 50%"
    commit_rows(lake_root, "raw_images", rows("lot 7", 1), "lot 7")
    assert [name for name in os.listdir(tmp_path) if "my" in name] == ["my lake 50%"]  # no sibling `my%20lake%2050%25`
    assert (lake_root / "iceberg_catalog.db").is_file() and (lake_root / "warehouse").is_dir()
    assert [path for path in files_under(lake_root) if path.endswith(".parquet") and "/data/" in path]
    assert len(read_rows(lake_root, "raw_images", "lot 7")) == 3
    assert len(read_rows(lake_root, "raw_images")) == 3


@pytest.mark.parametrize("batch", ["lotA", "lotA#retry"])
def test_a_failed_write_removes_only_the_files_it_wrote(tmp_path, batch):
    lake_root = tmp_path / "lake"
    before = commit_rows(lake_root, "raw_images", rows("lotA", 1), "lotA")
    tables = Lake(str(lake_root)).tables
    partition = next(path for path in files_under(lake_root / "warehouse") if "/batch=lotA/" in path).split("/batch=lotA/")[0]
    existing = files_under(partition + "/batch=lotA")
    written = []

    def failing(folder: str) -> list[str]:
        path = path_of(folder)
        os.makedirs(path)
        pq.write_table(rows(batch, 2), f"{path}/part-0.parquet")
        written.append(f"{path}/part-0.parquet")
        raise RuntimeError("an executor died")

    with pytest.raises(RuntimeError, match="an executor died"):
        tables.write_and_commit("raw_images", rows(batch, 2).schema, failing, batch)
    assert not os.path.exists(written[0])
    assert existing <= files_under(partition + "/batch=lotA")  # the partition's files, each in place
    table = tables.table("raw_images")
    assert table is not None and (current := table.current_snapshot()) is not None and current.snapshot_id == before
    assert [r["version"] for r in read_rows(lake_root, "raw_images", "lotA")] == [1] * 3


def test_nfc_and_nfd_spellings_are_one_batch_and_a_second_spelling_is_refused_with_a_reason(tmp_path):
    landing = tmp_path / "landing"
    (landing / NFD / "cat").mkdir(parents=True)
    (landing / NFD / "cat" / "a.png").write_bytes(b"x")
    zone = look(str(landing))
    assert list(zone.batches) == [NFC] and batch_name(NFD) == NFC
    # The asset looks the batch up by its name (NFC) and finds the NFD folder.
    landed = look_at_batch(f"{landing.as_uri()}/{NFC}")
    assert landed.path == f"{landing}/{NFD}" and landed.state.fingerprint == zone.batches[NFC].fingerprint
    (landing / NFC).mkdir()
    (landing / NFC / "b.png").write_bytes(b"y")
    zone = look(str(landing))
    assert list(zone.batches) == [NFC] and zone.batches[NFC].files == 1  # the NFC folder is the batch
    [refused] = zone.refused
    assert refused.path == f"{landing}/{NFD}" and refused.status == "bad_name" and "NFC/NFD" in refused.reason


def test_a_name_no_partition_key_can_hold_is_refused_at_listing_time(tmp_path):
    landing = tmp_path / "landing"
    for name in ("ok", "new\nline", "a...b"):
        (landing / name).mkdir(parents=True)
        (landing / name / "a.png").write_bytes(b"x")
    zone = look(str(landing))
    assert list(zone.batches) == ["ok"]
    assert {os.path.basename(entry.path) for entry in zone.refused} == {"new\nline", "a...b"}
    assert all(entry.status == "bad_name" and "partition key" in entry.reason for entry in zone.refused)
