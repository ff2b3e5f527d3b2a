"""The benchmarks' plumbing, and a quick run of two real benchmarks through `bench.run_all`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import common, run_all

REPO = Path(__file__).resolve().parents[3]


def test_result_lines_have_the_agreed_format():
    assert common.Result("ingest_throughput_ratio", 0.8312, ">=", 0.8).line() == (
        "RESULT ingest_throughput_ratio 0.8312 (goal >= 0.8)"
    )
    assert common.Result("serving_time_wait_after_requests", 3, "<=", 5).line() == (
        "RESULT serving_time_wait_after_requests 3 (goal <= 5)"
    )
    assert common.Result("a", 0.79, ">=", 0.8).met is False
    assert common.Result("b", 5, "<=", 5).met is True
    with pytest.raises(ValueError):
        common.Result("c", 1, "<", 2)


def test_timing_reports_median_and_spread():
    timing = common.Timing([2.0, 1.0, 4.0])
    assert timing.median == 2.0
    assert timing.spread == pytest.approx(1.5)  # (4 - 1) / 2
    assert timing.rate(100) == 50.0
    assert timing.to_dict(100)["per_s"] == 50.0


def test_interleaved_alternates_the_sides():
    calls = []
    timings = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, log=lambda _: None)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [len(t.samples) for t in timings.values()] == [3, 3]


def test_run_all_reads_result_lines():
    output = "noise\nRESULT x 1.5 (goal <= 2)\nRESULT y 0.5 (goal >= 0.8)\nRESULT z bad line\n"
    parsed = run_all.parse_results(output)
    assert [(r["name"], r["met"]) for r in parsed] == [("x", True), ("y", False)]


def test_a_disagreement_fails_the_benchmark_and_is_recorded(tmp_path, capsys):
    def run(report, args):
        report.result("never_printed", 1.0, ">=", 0.5)
        common.check(False, "project and baseline wrote different rows")

    code = common.main("fake", run, None, argv=["--quick", "--results-dir", str(tmp_path)])
    assert code == 1
    record = json.loads((tmp_path / "fake.quick.json").read_text())
    assert record["error"] == "MISMATCH: project and baseline wrote different rows"
    assert record["quick"] is True and record["params"]["repeats"] == 2


@pytest.mark.timeout(600)
def test_quick_run_of_two_benchmarks(tmp_path):
    results = tmp_path / "results"
    env = dict(os.environ, DGX_BENCH_DIR=str(tmp_path / "work"), PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--quick", "--only", "code_location,train_input", "--results-dir", str(results)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    names = {r["name"] for r in run_all.parse_results(out.stdout)}
    assert names == {
        "import_definitions_vs_dagster",
        "sensor_tick_vs_scandir",
        "sensor_idle_tick_vs_scandir",
        "train_input_ratio",
    }
    for benchmark in ("code_location", "train_input"):
        record = json.loads((results / f"{benchmark}.quick.json").read_text())
        assert "error" not in record
        assert record["results"] and all(r["value"] > 0 for r in record["results"])
        assert record["command"].startswith(f"python -m bench.{benchmark} --quick")
    summary = json.loads((results / "summary.quick.json").read_text())
    assert [run["benchmark"] for run in summary["runs"]] == ["code_location", "train_input"]
    assert (tmp_path / "work" / "code_location" / "landing-2000.done").exists()  # data went where we said
