"""The lake's staging sweep against real writer processes, SIGKILLed mid-write."""

from dgx_assets.lake import Lake


def test_staging_left_by_a_killed_run_is_swept_by_the_next_commit_but_never_a_live_one(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    lake = Lake(str(tmp_path / "lake"))
    code = (
        "import os, signal, sys; from dgx_assets.lake import Lake; lake = Lake(sys.argv[1]); "
        "staging = lake.staging_uri('table', sys.argv[2]); lake.write_bytes(staging + '/part-0.parquet', b'half'); "
        "print(staging, flush=True); sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    runs = {
        key: subprocess.Popen(
            [sys.executable, "-c", code, lake.root, key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for key in ("killed", "live")
    }
    try:
        stagings = {key: run.stdout.readline().strip() for key, run in runs.items()}
        runs["killed"].stdin.write("\n")
        runs["killed"].stdin.flush()
        assert runs["killed"].wait(timeout=30) == -signal.SIGKILL
        mine = lake.staging_uri("table", "b2")  # this process' own, still being written
        lake.write_bytes(mine + "/part-0.parquet", b"in progress")
        staging = lake.staging_uri("table", "b1")
        lake.write_bytes(staging + "/part-0.parquet", b"new")
        lake.commit(staging, lake.asset_uri("table", "b1"))
        assert not lake.exists(stagings["killed"])  # swept
        assert lake.exists(stagings["live"]) and lake.exists(mine)  # runs still going: kept
    finally:
        for run in runs.values():
            if run.poll() is None:
                os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
    assert lake.partitions("table") == ["b1"]  # a listing sweeps too: the second run is dead now
    assert not lake.exists(stagings["live"]) and lake.exists(mine)
