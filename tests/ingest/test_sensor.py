"""The landing-zone sensor against a real folder and a real Dagster instance."""

import json
import time

import dagster as dg
from imagefactory import valid_images

from dgx_assets.ingest.sensors import landing_zone_sensor
from dgx_assets.partitions import image_batches
from dgx_assets.resources import LakeResource


def land(landing, batch, names=("a.png", "b.png"), label="functional"):
    folder = landing / batch / label
    folder.mkdir(parents=True, exist_ok=True)
    images = list(valid_images().values())
    for index, name in enumerate(names):
        (folder / name).write_bytes(images[index % len(images)])


def tick(instance, lake_root, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"lake": LakeResource(root=str(lake_root))})
    result = landing_zone_sensor(context)
    for request in result.dynamic_partitions_requests:  # what the daemon does with them
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


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
    for relative, data in [("b1/functional/a.png", b"aa"), ("b1/defective/b.png", b"bbb"),
                           ("b1/.hidden/c.png", b"c"), ("b1/functional/.d.png", b"d"), ("b1/_tmp/e.png", b"e"),
                           ("b1/functional/f.png._COPYING_", b"ff"), ("_staging/b9/g.png", b"g"), ("b2/x/h.png", b"h")]:
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
    for relative in ["b1/functional/a.png", "b1/defective/deep/b.png", "b1/.hidden/c.png", "b1/top.png",
                     "b1/functional/f.png._COPYING_", "_staging/b9/g.png", "b2/x/h.png", "loose.png"]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(relative.encode())
    (root / "b3").mkdir()
    (root / "b1" / "functional" / "dangling.png").symlink_to(root / "nowhere.png")  # skipped, not fatal

    walked = landing_scan._walk_local(str(root))
    listed = landing_scan._list_remote(pafs.LocalFileSystem(), str(root))
    states = {name: landing_scan._state(name, str(root), entries) for name, entries in walked.items()}
    assert states == {name: landing_scan._state(name, str(root), entries) for name, entries in listed.items()}
    assert states == landing_scan.scan_landing(str(root)) and sorted(states) == ["b1", "b2", "b3"]

    counted = sorted(["b1/defective/deep/b.png", "b1/functional/a.png", "b1/functional/f.png._COPYING_", "b1/top.png"])
    lines = ""
    for relative in counted:
        stat = (root / relative).stat()
        lines += f"{root / relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
    assert states["b1"].fingerprint == hashlib.sha256(lines.encode()).hexdigest()[:16]
    assert states["b1"].files == 4 and states["b1"].in_progress == ("b1/functional/f.png._COPYING_",)
