"""Run every benchmark, one after the other, each in its own process; then one summary of every goal.

    python -m bench.run_all              # make bench: full inputs (tens of minutes on a 2-core machine)
    python -m bench.run_all --quick      # make bench-quick: tiny inputs, a smoke run
    python -m bench.run_all --quick --only code_location,train_input

Each benchmark prints its own figures and `RESULT` lines and writes `bench/results/<name>.json`
(`<name>.quick.json` in quick mode); the summary goes to `bench/results/summary[.quick].json`.
Exit code 1 when a benchmark broke (an error, or its two sides disagreed); a missed goal is reported, not
an error, unless `--strict`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import REPO, RESULTS_DIR, prepare_environment

# Cheapest first, so a smoke run shows trouble early; each runs alone (they would fight for the CPUs).
BENCHMARKS = (
    "code_location",
    "train_input",
    "drift",
    "edge",
    "serving",
    "ingest",
    "features",
    "scoring",
    "png_saver",
    "generator_diversity",
    "end_to_end",
    "scale_out",
    "model_cv",
)
# `RESULT <name> <value> [<low>, <high>] n=<rounds> (goal <op> <x>)`; the interval is optional to the reader.
RESULT_LINE = re.compile(r"^RESULT (\S+) (\S+)(?: \[(\S+), (\S+)\] n=(\d+))? \(goal (>=|<=) (\S+)\)$")


def parse_results(output: str) -> list[dict]:
    results = []
    for line in output.splitlines():
        match = RESULT_LINE.match(line.strip())
        if match:
            name, value, low, high, rounds, op, goal = match.groups()
            value, goal = float(value), float(goal)
            results.append(
                {
                    "name": name,
                    "value": value,
                    "low": float(low) if low else None,
                    "high": float(high) if high else None,
                    "rounds": int(rounds) if rounds else None,
                    "op": op,
                    "goal": goal,
                    "met": value >= goal if op == ">=" else value <= goal,
                    "line": line.strip(),
                }
            )
    return results


def run_one(name: str, quick: bool, results_dir: Path | None, timeout_s: float) -> dict:
    command = [sys.executable, "-m", f"bench.{name}"] + (["--quick"] if quick else [])
    if results_dir:
        command += ["--results-dir", str(results_dir)]
    started = time.perf_counter()
    lines: list[str] = []
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONPATH=str(REPO))
    )
    watchdog = threading.Timer(timeout_s, process.kill)  # this PID only: the benchmark we started
    watchdog.start()
    assert process.stdout is not None
    try:
        for line in process.stdout:  # streamed: a long benchmark shows its progress
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        code = process.wait()
    finally:
        watchdog.cancel()
    seconds = time.perf_counter() - started
    timed_out = seconds >= timeout_s and code != 0
    results = parse_results("".join(lines))
    status = "timed out" if timed_out else ("ok" if code == 0 else f"failed (exit {code})")
    if status == "ok" and not results:
        status = "no RESULT lines"  # a benchmark that measured nothing is broken, too
    return {
        "benchmark": name,
        "status": status,
        "seconds": round(seconds, 1),
        "results": results,
        "command": " ".join(["python -m", f"bench.{name}"] + command[3:]),
    }


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--quick", action="store_true", help="tiny inputs: a smoke run")
    cli.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(BENCHMARKS)}")
    cli.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    cli.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default bench/results)")
    cli.add_argument("--timeout-s", type=float, default=3600.0, help="per benchmark (default 3600)")
    cli.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed, too")
    args = cli.parse_args(argv)

    chosen = [name.strip() for name in args.only.split(",")] if args.only else list(BENCHMARKS)
    skipped = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = [name for name in [*chosen, *skipped] if name not in BENCHMARKS]
    if unknown:
        cli.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    chosen = [name for name in chosen if name not in skipped]
    prepare_environment()

    started_at, clock = dt.datetime.now().astimezone(), time.perf_counter()
    runs = [run_one(name, args.quick, args.results_dir, args.timeout_s) for name in chosen]
    total = time.perf_counter() - clock

    print("\n== summary " + ("(quick) " if args.quick else "") + f"{started_at:%Y-%m-%d %H:%M} ({total:.0f}s)")
    for entry in runs:
        print(f"{entry['benchmark']:<14} {entry['status']:<18} {entry['seconds']:>7.0f}s")
        for result in entry["results"]:
            print(f"    {'met   ' if result['met'] else 'MISSED'} {result['line']}")
    broken = [entry["benchmark"] for entry in runs if entry["status"] != "ok"]
    missed = [result["name"] for entry in runs for result in entry["results"] if not result["met"]]
    if broken:
        print(f"broken: {', '.join(broken)} (see their output above and their JSON for the reason)")
    print(f"goals met: {sum(r['met'] for e in runs for r in e['results'])}, missed: {len(missed)}")

    folder = Path(args.results_dir or os.environ.get("DGX_BENCH_RESULTS") or RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    summary = folder / ("summary.quick.json" if args.quick else "summary.json")
    summary.write_text(
        json.dumps(
            {
                "command": "python -m bench.run_all" + (" --quick" if args.quick else ""),
                "date": started_at.isoformat(timespec="seconds"),
                "seconds": round(total, 1),
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {summary}")
    return 1 if broken or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
