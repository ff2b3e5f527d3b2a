"""The landing-zone sensor against a real folder and a real Dagster instance."""

import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest
from support.hostile import hostile_batch
from support.sensor_ticks import land, tick

from dgx_assets.partitions import image_batches


def test_new_batch_requests_one_run_once_it_is_stable(tmp_path):
    lake_root = tmp_path / "lake"
    land(lake_root / "landing", "2026-12-01")
    (lake_root / "landing" / "_SUCCESS").write_bytes(b"")
    with dg.instance_for_test() as instance:
        first = tick(instance, lake_root, None)
        assert first.run_requests == []  # first sight: wait one tick to see it is not still growing
        second = tick(instance, lake_root, first.cursor)
        assert [r.partition_key for r in second.run_requests] == ["2026-12-01"]
        assert second.run_requests[0].run_key.startswith("2026-12-01:")
        assert instance.get_dynamic_partitions(image_batches.name) == ["2026-12-01"]
        third = tick(instance, lake_root, second.cursor)  # the same tick again: nothing
        assert third.run_requests == []


def test_batch_with_a_file_still_copying_waits_until_complete(tmp_path):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "b1")
    (landing / "b1" / "functional" / "c.png._COPYING_").write_bytes(b"partial")
    with dg.instance_for_test() as instance:
        cursor = None
        for _ in range(3):
            result = tick(instance, lake_root, cursor)
            assert result.run_requests == []
            cursor = result.cursor
        assert "still being copied" in result.skip_reason.skip_message
        (landing / "b1" / "functional" / "c.png._COPYING_").rename(landing / "b1" / "functional" / "c.png")
        result = tick(instance, lake_root, cursor)
        assert result.run_requests == []  # changed since the last look
        result = tick(instance, lake_root, result.cursor)
        assert [r.partition_key for r in result.run_requests] == ["b1"]


def test_growing_batch_is_not_ingested_until_sizes_settle(tmp_path):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "b1", names=("a.png",))
    with dg.instance_for_test() as instance:
        result = tick(instance, lake_root, None)
        land(landing, "b1", names=("a.png", "b.png"))  # a second file arrives between ticks
        result = tick(instance, lake_root, result.cursor)
        assert result.run_requests == []
        result = tick(instance, lake_root, result.cursor)
        assert len(result.run_requests) == 1


def test_cursor_survives_a_restart_and_changed_batches_run_again(tmp_path):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "b1")
    land(landing, "b2")
    with dg.instance_for_test() as instance:
        cursor = tick(instance, lake_root, tick(instance, lake_root, None).cursor).cursor
    with dg.instance_for_test() as restarted:  # a new daemon process, same stored cursor
        result = tick(restarted, lake_root, cursor)
        assert result.run_requests == []
        time.sleep(0.01)
        land(landing, "b2", names=("a.png", "b.png", "new.png"))
        result = tick(restarted, lake_root, tick(restarted, lake_root, result.cursor).cursor)
        assert [r.partition_key for r in result.run_requests] == ["b2"]


def test_cursor_stays_small_for_many_files(tmp_path):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    for batch in range(3):
        folder = landing / f"b{batch}" / "functional"
        folder.mkdir(parents=True)
        for index in range(2000):
            (folder / f"{index}.png").write_bytes(b"x")
    with dg.instance_for_test() as instance:
        cursor = tick(instance, lake_root, tick(instance, lake_root, None).cursor).cursor
    assert len(json.loads(cursor)["requested"]) == 3
    assert len(cursor) < 200  # one short fingerprint per batch, not per file


def test_scan_counts_only_visible_files_and_fingerprints_what_it_counts(tmp_path):
    from dgx_assets.ingest.landing import scan_landing

    landing = tmp_path / "landing"
    for relative, data in [
        ("b1/functional/a.png", b"aa"),
        ("b1/defective/b.png", b"bbb"),
        ("b1/.hidden/c.png", b"c"),
        ("b1/functional/.d.png", b"d"),
        ("b1/_tmp/e.png", b"e"),
        ("b1/functional/f.png._COPYING_", b"ff"),
        ("_staging/b9/g.png", b"g"),
        ("b2/x/h.png", b"h"),
    ]:
        (landing / relative).parent.mkdir(parents=True, exist_ok=True)
        (landing / relative).write_bytes(data)
    (landing / "b3").mkdir()
    first = scan_landing(str(landing))
    assert sorted(first) == ["b1", "b2", "b3"]
    b1 = first["b1"]
    assert (b1.files, b1.total_bytes) == (3, 2 + 3 + 2)  # a, b and the file still copying
    assert b1.in_progress == ("b1/functional/f.png._COPYING_",) and not b1.complete
    assert first["b3"].files == 0 and not first["b3"].complete
    (landing / "b1" / ".hidden" / "c.png").write_bytes(b"changed")  # invisible: same fingerprint
    assert scan_landing(str(landing))["b1"].fingerprint == b1.fingerprint
    (landing / "b1" / "defective" / "b.png").write_bytes(b"bbbb")
    assert scan_landing(str(landing))["b1"].fingerprint != b1.fingerprint


def test_local_walk_and_remote_listing_agree_and_keep_the_cursor_fingerprint(tmp_path):
    """Local landing zones are walked with os.scandir, HDFS is listed through pyarrow: the same tree must
    give the same states through both, and fingerprints must keep the formula cursors were written with."""
    import hashlib

    import pyarrow.fs as pafs

    from dgx_assets.ingest import landing as landing_scan

    root = tmp_path / "landing"
    for relative in [
        "b1/functional/a.png",
        "b1/defective/deep/b.png",
        "b1/.hidden/c.png",
        "b1/top.png",
        "b1/functional/f.png._COPYING_",
        "_staging/b9/g.png",
        "b2/x/h.png",
        "loose.png",
    ]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(relative.encode())
    (root / "b3").mkdir()

    walked, _ = landing_scan._walk_local(str(root))
    listed, _ = landing_scan._list_remote(pafs.LocalFileSystem(), str(root))
    states = {name: landing_scan.batch_state(name, str(root), entries) for name, entries in walked.items()}
    assert states == {name: landing_scan.batch_state(name, str(root), entries) for name, entries in listed.items()}
    assert states == landing_scan.scan_landing(str(root)) and sorted(states) == ["b1", "b2", "b3"]

    counted = sorted(["b1/defective/deep/b.png", "b1/functional/a.png", "b1/functional/f.png._COPYING_", "b1/top.png"])
    lines = ""
    for relative in counted:
        stat = (root / relative).stat()
        lines += f"{root / relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
    assert states["b1"].fingerprint == hashlib.sha256(lines.encode()).hexdigest()[:16]
    assert states["b1"].files == 4 and states["b1"].in_progress == ("b1/functional/f.png._COPYING_",)


@pytest.mark.timeout(60)
def test_a_hostile_batch_costs_only_itself_and_the_tick_says_what_it_skipped(tmp_path):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "good")
    with hostile_batch(landing, tmp_path / "outside"), dg.instance_for_test() as instance:
        (landing / "linked_batch").symlink_to(tmp_path / "outside", target_is_directory=True)  # a batch that is a link
        os.mkfifo(landing / "pipe")
        first = tick(instance, lake_root, None)  # before the fix: OSError, too many levels of symbolic links
        assert first.run_requests == []
        second = tick(instance, lake_root, first.cursor)
        requests = {request.partition_key: request for request in second.run_requests}
        assert sorted(requests) == ["good", "hostile"]  # the links were never followed into a batch of their own
        assert "dgx/refused_entries" not in requests["good"].tags
        refused = requests["hostile"].tags["dgx/refused_entries"]
        assert refused.startswith("8 entries not read: ") and "hostile/functional/loop (symlink)" in refused
        assert "fifo.png (special_file)" in refused
        third = tick(instance, lake_root, second.cursor)
        assert third.run_requests == []
        assert "skipped, not batch folders: linked_batch (symlink), pipe (special_file)" in third.skip_reason.skip_message


def look_as_nobody(landing: Path) -> dict:
    """`look` at the landing zone from a forked child that dropped root (as root every folder can be listed)."""
    from dgx_assets.ingest.landing import look

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so nothing has to be importable by `nobody`
        status = 1
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            zone = look(str(landing))
            states = {
                name: [state.files, state.complete, [(r.path, r.status, r.reason) for r in state.refused]]
                for name, state in zone.batches.items()
            }
            os.write(write_end, json.dumps(states).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(data)


def test_a_folder_that_cannot_be_listed_costs_only_its_batch(tmp_path):
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="landing-"))  # tmp_path's parents are closed to other users
    try:
        shared.chmod(0o755)
        landing = shared / "landing"
        land(landing, "open")
        land(landing, "partly")
        (landing / "partly" / "locked").mkdir()
        land(landing, "closed")
        for path in [*landing.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (landing / "partly" / "locked").chmod(0)
        (landing / "closed").chmod(0)
        states = look_as_nobody(landing)
    finally:
        for path in shared.rglob("*"):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(shared)
    assert states["open"] == [2, True, []]
    files, complete, refused = states["partly"]
    assert (files, complete) == (2, True)
    assert [(path, status) for path, status, _ in refused] == [(str(landing / "partly" / "locked"), "unlistable")]
    assert "PermissionError" in refused[0][2]
    files, complete, refused = states["closed"]
    assert (files, complete, [status for _, status, _ in refused]) == (0, False, ["unlistable"])


def test_names_that_are_not_utf8_cost_only_their_own_entry_and_other_batches_run(tmp_path):
    """Was: one b'\\xff' name raised UnicodeEncodeError on every tick, and no batch was ever requested."""
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "good")
    land(landing, "mixed")
    raw_landing = os.fsencode(landing)
    with open(os.path.join(raw_landing, b"mixed", b"functional", b"cell-\xff.png"), "wb") as handle:
        handle.write(b"not read")
    os.makedirs(os.path.join(raw_landing, b"batch-\xff", b"functional"))  # a batch folder that cannot be a partition key
    with open(os.path.join(raw_landing, b"batch-\xff", b"functional", b"a.png"), "wb") as handle:
        handle.write(b"not read")
    with dg.instance_for_test() as instance:
        second = tick(instance, lake_root, tick(instance, lake_root, None).cursor)
        requests = {request.partition_key: request for request in second.run_requests}
        assert sorted(requests) == ["good", "mixed"]
        assert requests["mixed"].tags["dgx/refused_entries"] == "1 entry not read: mixed/functional/cell-\\xff.png (bad_name)"
        assert instance.get_dynamic_partitions(image_batches.name) == ["good", "mixed"]
        third = tick(instance, lake_root, second.cursor)
        assert "skipped, not batch folders: batch-\\xff (bad_name)" in third.skip_reason.skip_message

    from dgx_assets.ingest.landing import look_at_batch

    [refused] = look_at_batch(str(landing / "mixed")).listing.refused
    assert refused.path == str(landing / "mixed" / "functional" / "cell-\\xff.png")
    assert "not valid UTF-8" in refused.reason and "rename" in refused.reason


def test_a_batch_with_production_images_is_scored_in_its_ingest_run(tmp_path):
    from imagefactory import valid_images

    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "labelled")
    land(landing, "line", names=("a.png",))
    (landing / "line" / "camera-3.png").write_bytes(next(iter(valid_images().values())))  # no label folder
    with dg.instance_for_test() as instance:
        result = tick(instance, lake_root, tick(instance, lake_root, None).cursor)
    selections = {r.partition_key: {key.to_user_string() for key in r.asset_selection} for r in result.run_requests}
    ingest = {"raw_images", "image_features"}
    assert selections == {"labelled": ingest, "line": ingest | {"defect_predictions", "review_queue"}}
