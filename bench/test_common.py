"""The benchmarks' own plumbing: RESULT lines, timings, intervals, run_all's reader.

Run by `make bench-quick` before the benchmarks (`python -m pytest bench`): tests/ never imports bench/,
so these live beside the code they check.
"""

import json

import pytest

from bench import common, run_all


def test_result_lines_carry_their_interval():
    assert common.Result("ingest_throughput_ratio", 0.8312, ">=", 0.8, low=0.79, high=0.86, rounds=3).line() == (
        "RESULT ingest_throughput_ratio 0.8312 [0.79, 0.86] n=3 (goal >= 0.8)"
    )
    assert common.Result("serving_time_wait_after_requests", 3, "<=", 5).line() == (
        "RESULT serving_time_wait_after_requests 3 [3, 3] n=1 (goal <= 5)"  # measured once: no spread to show
    )
    assert common.Result("a", 0.79, ">=", 0.8).met is False
    assert common.Result("b", 5, "<=", 5).met is True
    with pytest.raises(ValueError):
        common.Result("c", 1, "<", 2)
    with pytest.raises(ValueError):
        common.Result("d", 1, "<=", 2, low=0.5)


def test_a_ratio_of_timings_takes_its_interval_from_the_paired_rounds():
    report = common.Report("fake", quick=True)
    baseline, project = common.Timing([2.0, 3.0, 2.0]), common.Timing([1.0, 2.0, 2.5])
    outcome = report.ratio("r", baseline, project, ">=", 1.0)
    assert outcome.value == pytest.approx(1.0)  # median 2.0 / median 2.0
    assert (outcome.low, outcome.high, outcome.rounds) == (pytest.approx(0.8), pytest.approx(2.0), 3)
    assert outcome.line() == "RESULT r 1 [0.8, 2] n=3 (goal >= 1)"


def test_bootstrap_interval_brackets_the_statistic():
    low, high = common.bootstrap_interval(lambda a, b: sum(a) / len(a) - sum(b) / len(b), [3.0, 4.0, 5.0] * 10, [1.0] * 30)
    assert low < 3.0 < high and high - low < 1.0
    assert common.bootstrap_interval(max, [1.0, 2.0]) == common.bootstrap_interval(max, [1.0, 2.0])  # fixed seed


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


def test_run_all_reads_result_lines_with_or_without_an_interval():
    output = "noise\nRESULT x 1.5 [1.2, 1.9] n=3 (goal <= 2)\nRESULT y 0.5 (goal >= 0.8)\nRESULT z bad line\n"
    parsed = run_all.parse_results(output)
    assert [(r["name"], r["met"], r["low"], r["high"], r["rounds"]) for r in parsed] == [
        ("x", True, 1.2, 1.9, 3),
        ("y", False, None, None, None),
    ]


def test_a_disagreement_fails_the_benchmark_and_is_recorded(tmp_path):
    def run(report, args):
        report.result("never_printed", 1.0, ">=", 0.5)
        common.check(False, "project and baseline wrote different rows")

    code = common.main("fake", run, None, argv=["--quick", "--results-dir", str(tmp_path)])
    assert code == 1
    record = json.loads((tmp_path / "fake.quick.json").read_text())
    assert record["error"] == "MISMATCH: project and baseline wrote different rows"
    assert record["quick"] is True and record["params"]["repeats"] == 2


def test_a_noisy_benchmark_asks_for_more_rounds_and_the_flag_still_wins(tmp_path):
    seen = []

    def run(report, args):
        seen.append(args.repeats)

    common.main("fake", run, None, argv=["--results-dir", str(tmp_path)], repeats=7)
    common.main("fake", run, None, argv=["--results-dir", str(tmp_path), "--repeats", "4"], repeats=7)
    common.main("fake", run, None, argv=["--quick", "--results-dir", str(tmp_path)], repeats=7)
    assert seen == [7, 4, 2]
    assert json.loads((tmp_path / "fake.json").read_text())["params"]["repeats"] == 4
