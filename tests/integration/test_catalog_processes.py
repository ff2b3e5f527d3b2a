"""The lake's Iceberg commits against real processes: a writer SIGKILLed during its commits, two writers on
different batches at once (plain commits, and raw_images materialized with real Spark), a scan while another
process overwrites the batch it reads."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.lake_tables import read_rows

from dgx_assets.lake.store import Lake

WRITER = Path(__file__).parent.parent / "support" / "lake_writer.py"
ROWS = 90


def start_writer(lake_root: Path, batch: str, versions: int, rows: int = ROWS) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(lake_root), batch, str(versions), str(rows)], stdout=subprocess.PIPE, text=True
    )


def versions_of(lake_root: Path, batch: str) -> list[int]:
    return [row["version"] for row in read_rows(lake_root, "raw_images", batch)]


@pytest.mark.timeout(300)
def test_a_writer_killed_during_its_commits_leaves_the_old_or_the_new_version_never_a_mix(tmp_path):
    lake_root = tmp_path / "lake"
    other = start_writer(lake_root, "b2", 1, rows=5)
    assert other.wait(timeout=120) == 0
    rng = random.Random(31)
    for _ in range(4):
        writer = start_writer(lake_root, "b1", 1000)
        committed = writer.stdout.readline().strip()  # it is in its commit loop now
        time.sleep(rng.uniform(0.05, 0.6))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
        seen = versions_of(lake_root, "b1")
        assert len(seen) == ROWS and len(set(seen)) == 1, sorted(set(seen))  # one whole version
        assert seen[0] >= int(committed)
        assert versions_of(lake_root, "b2") == [1] * 5  # the other batch is untouched
    # The table takes the next commit as usual.
    assert start_writer(lake_root, "b1", 1).wait(timeout=120) == 0 and versions_of(lake_root, "b1") == [1] * ROWS


@pytest.mark.timeout(300)
def test_two_processes_committing_different_batches_at_once_both_land(tmp_path):
    lake_root = tmp_path / "lake"
    writers = {batch: start_writer(lake_root, batch, 12) for batch in ("b1", "b2")}
    for writer in writers.values():
        assert writer.wait(timeout=240) == 0  # a lost race is redone on the fresh table, never an error
    assert Lake(str(lake_root)).tables.partitions("raw_images") == ["b1", "b2"]
    for batch in writers:
        assert versions_of(lake_root, batch) == [12] * ROWS
    appends = [row for row in Lake(str(lake_root)).tables.history("raw_images") if row["operation"] == "append"]
    assert len(appends) == 24  # every commit of both processes is in the table's history


@pytest.mark.timeout(300)
def test_a_scan_during_an_overwrite_sees_one_version(tmp_path):
    lake_root = tmp_path / "lake"
    assert start_writer(lake_root, "b1", 1).wait(timeout=120) == 0
    writer = start_writer(lake_root, "b1", 40)
    seen_versions = set()
    try:
        while writer.poll() is None:
            seen = versions_of(lake_root, "b1")
            assert len(seen) == ROWS and len(set(seen)) == 1, sorted(set(seen))
            seen_versions.add(seen[0])
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=30)
    assert writer.returncode == 0 and len(seen_versions) > 1  # it really read while versions changed


@pytest.mark.timeout(600)
def test_two_processes_materializing_raw_images_for_different_batches_both_land(tmp_path):
    """Two Dagster runs in two processes, each with its own local Spark, commit their batches to one table."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from imagefactory import write_batch

    lake_root = tmp_path / "lake"
    for seed, batch in enumerate(("p1", "p2")):
        write_batch(lake_root / "landing", batch, seed=seed, bad=False)
    code = (
        "import sys, dagster as dg; from dgx_assets.defs.ingest.assets import raw_images; "
        "from dgx_assets.defs.resources import LakeResource; from dgx_assets.defs.resources import SparkResource\n"
        "with dg.instance_for_test() as instance:\n"
        "    instance.add_dynamic_partitions('image_batches', [sys.argv[2]])\n"
        "    spark = SparkResource(spark_conf={'spark.master': 'local[1]', 'spark.ui.enabled': 'false', "
        "'spark.eventLog.enabled': 'false'})\n"
        "    result = dg.materialize([raw_images], instance=instance, partition_key=sys.argv[2], "
        "resources={'spark': spark, 'lake': LakeResource(root=sys.argv[1])})\n"
        "    print(result.asset_materializations_for_node('raw_images')[0].metadata['snapshot_id'].value)\n"
    )
    runs = {
        batch: subprocess.Popen([sys.executable, "-c", code, str(lake_root), batch], stdout=subprocess.PIPE, text=True)
        for batch in ("p1", "p2")
    }
    snapshots = {}
    for batch, run in runs.items():
        out, _ = run.communicate(timeout=540)
        assert run.returncode == 0
        snapshots[batch] = int(out.strip().splitlines()[-1])
    tables = Lake(str(lake_root)).tables
    assert tables.partitions("raw_images") == ["p1", "p2"]
    for batch, snapshot_id in snapshots.items():  # each run's own snapshot holds its batch
        assert (
            tables.snapshot("raw_images", snapshot_id, batch).dataset().count_rows()
            == len(read_rows(lake_root, "raw_images", batch))
            > 0
        )


OPEN_CATALOG_AT = """
import sys, time
from dgx_assets.lake.store import Lake
tables = Lake(sys.argv[1]).tables
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
tables.catalog
"""


@pytest.mark.timeout(300)
def test_processes_opening_a_new_lakes_catalog_at_the_same_moment_all_succeed(tmp_path):
    """The first use of a lake creates its namespace; processes that race to create it must all go on."""
    for attempt in range(3):
        start_at = str(time.time() + 8)  # after every process has imported pyiceberg
        openers = [
            subprocess.Popen([sys.executable, "-c", OPEN_CATALOG_AT, str(tmp_path / f"lake{attempt}"), start_at])
            for _ in range(6)
        ]
        assert [opener.wait(timeout=120) for opener in openers] == [0] * 6
