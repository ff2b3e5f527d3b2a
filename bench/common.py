"""What every benchmark shares: timing (repeats, median, spread), goals, RESULT lines and the JSON record.

A benchmark script defines `run(report, args)` and ends with `sys.exit(main(NAME, run, __doc__))`.
`run` measures the project's path and the plain baseline on the same inputs, checks that both gave the
same result (raising `Mismatch` if not, so a fast wrong path cannot win), and records figures and goals
on the `Report`. `main` then prints one line per goal, the value with its interval over n rounds:

    RESULT <name> <value> [<low>, <high>] n=<n> (goal >= <x>)
    RESULT <name> <value> [<low>, <high>] n=<n> (goal <= <x>)

`Report.ratio` takes the interval of a timing ratio from the paired rounds of `interleaved` (the lowest
and highest round-by-round ratio); other results pass theirs, and a value measured once (a count, a peak)
says so with n=1 and [value, value].

and writes everything to `bench/results/<name>.json` (`<name>.quick.json` in quick mode, so a smoke run
never overwrites the figures of a full one).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dgx_assets import settings

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"


class Mismatch(AssertionError):
    """The project's path and the baseline disagree: timing them would compare different work."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Mismatch(message)


# --- environment ------------------------------------------------------------------------------------------


def prepare_environment() -> None:
    """Loopback only, no telemetry, the venv's Python for Spark workers (docs/architecture.md: known pitfalls)."""
    settings.apply_process_defaults()


def work_dir(name: str) -> Path:
    """`.dgx/bench/<name>` (git ignores .dgx): generated inputs and outputs, never committed.

    DGX_BENCH_DIR moves it (the smoke test points it at a temporary folder).
    """
    base = Path(os.environ.get("DGX_BENCH_DIR") or REPO / ".dgx" / "bench")
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def isolate_state(name: str) -> Path:
    """Point the project's state (lake, MLflow, Spark event log) at the benchmark's own folder."""
    state = work_dir(name) / "state"
    state.mkdir(parents=True, exist_ok=True)
    os.environ["DGX_STATE_DIR"] = str(state)
    for variable in ("DGX_LAKE_ROOT", "DGX_LANDING_URI", "DGX_PROMPTS_URI", "MLFLOW_TRACKING_URI"):
        os.environ.pop(variable, None)
    return state


# --- timing -----------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """Wall-clock seconds of repeated runs of one side."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the repeats were, as a fraction."""
        return (max(self.samples) - min(self.samples)) / self.median if self.median else 0.0

    def rate(self, items: int) -> float:
        """Items per second at the median time."""
        return items / self.median

    def to_dict(self, items: int | None = None) -> dict:
        out = {
            "median_s": round(self.median, 6),
            "min_s": round(min(self.samples), 6),
            "max_s": round(max(self.samples), 6),
            "spread": round(self.spread, 4),
            "samples_s": [round(s, 6) for s in self.samples],
        }
        if items:
            out["items"] = items
            out["per_s"] = round(self.rate(items), 3)
        return out

    def describe(self, items: int | None = None, unit: str = "items") -> str:
        text = f"median {self.median:.3f}s (min {min(self.samples):.3f}, max {max(self.samples):.3f}, n={len(self.samples)})"
        if items:
            text += f" = {self.rate(items):,.1f} {unit}/s"
        return text


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def interleaved(
    sides: dict[str, Callable[[], object]], repeats: int, *, log=print, self_timed: bool = False
) -> dict[str, Timing]:
    """Run each side `repeats` times, alternating (A B A B ...), so load from neighbours hits both alike.

    The order flips every round (A B, B A, ...) so neither side always runs on a warmer cache. With
    `self_timed`, each side returns the seconds to count itself: only part of its work is the measurement.
    """
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(repeats):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            seconds, value = timed(sides[name])
            if self_timed:
                seconds = float(value)
            samples[name].append(seconds)
            log(f"  [{round_index + 1}/{repeats}] {name}: {seconds:.3f}s")
    return {name: Timing(values) for name, values in samples.items()}


def bootstrap_interval(statistic: Callable[..., float], *samples: list[float], resamples: int = 2000, level: float = 0.95):
    """Percentile bootstrap of `statistic(*samples)`, each sample resampled with replacement on its own (fixed seed)."""
    rng = random.Random(0)
    values = sorted(statistic(*(rng.choices(sample, k=len(sample)) for sample in samples)) for _ in range(resamples))
    cut = int(resamples * (1 - level) / 2)
    return values[cut], values[-cut - 1]


def ratio_spread(numerator: Timing, denominator: Timing) -> tuple[float, float]:
    """The lowest and highest ratio pairing round by round (same round = same machine load)."""
    ratios = [n / d for n, d in zip(numerator.samples, denominator.samples) if d]
    return (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))


# --- processes -------------------------------------------------------------------------------------------


def read_text(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """`root` and every process under it, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_text(f"/proc/{entry}/stat")
            if stat:
                tree.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, []))
    return found


def executable(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def cpu_seconds_by_kind() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and its live descendants, by kind:
    `this process`, `JVM` (Spark), `Python children` (Spark's Python workers, a process pool)."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    me = os.getpid()
    for pid in descendants(me):
        stat = read_text(f"/proc/{pid}/stat")
        if not stat:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        exe = executable(pid)
        kind = (
            "this process"
            if pid == me
            else "JVM"
            if exe.startswith("java")
            else "Python children"
            if exe.startswith("python")
            else "other"
        )
        totals[kind] = totals.get(kind, 0.0) + seconds
    return totals


def cpu_used(fn: Callable[[], object]) -> dict[str, float]:
    """CPU seconds by kind of process that `fn` caused (children that exit meanwhile are not counted)."""
    before = cpu_seconds_by_kind()
    fn()
    after = cpu_seconds_by_kind()
    return {kind: round(after[kind] - before.get(kind, 0.0), 2) for kind in after if after[kind] - before.get(kind, 0.0) > 0.005}


def record_sides(report: Report, timings: dict[str, Timing], sides: dict[str, Callable[[], object]], items: int) -> None:
    """Each side's timing, the round-by-round ratio range of each baseline against the first side (the project's),
    and the CPU seconds of one more run of each side, by kind of process, on the report."""
    project, *baselines = sides
    for side in sides:
        report.figure(side, timings[side].to_dict(items))
    for side in baselines:
        low, high = ratio_spread(timings[side], timings[project])
        report.figure(f"ratio_range_vs_{side}", [round(low, 3), round(high, 3)])
    cpu = {side: cpu_used(fn) for side, fn in sides.items()}
    report.figure("cpu_seconds_by_process", cpu)
    print(f"CPU seconds by process: {cpu}")


# --- goals and the record ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    value: float
    op: str  # ">=" or "<="
    goal: float
    detail: str = ""
    low: float | None = None  # the interval of the value over `rounds` measurements; [value, value] when n=1
    high: float | None = None
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"goal operator must be '>=' or '<=', got {self.op!r}")
        if (self.low is None) != (self.high is None):
            raise ValueError("an interval needs both ends")
        if self.low is None:
            self.low = self.high = self.value
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")

    @property
    def met(self) -> bool:
        return self.value >= self.goal if self.op == ">=" else self.value <= self.goal

    def line(self) -> str:
        interval = f"[{format_number(self.low)}, {format_number(self.high)}] n={self.rounds}"
        return f"RESULT {self.name} {format_number(self.value)} {interval} (goal {self.op} {format_number(self.goal)})"


def format_number(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.4g}"


@dataclass
class Report:
    name: str
    quick: bool
    params: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def figure(self, key: str, value) -> None:
        self.figures[key] = value

    def result(
        self,
        name: str,
        value: float,
        op: str,
        goal: float,
        detail: str = "",
        *,
        interval: tuple[float, float] | None = None,
        rounds: int = 1,
    ) -> Result:
        """A goal's value; `interval` (low, high) over `rounds` measurements, none for a value measured once."""
        low, high = (float(interval[0]), float(interval[1])) if interval else (None, None)
        outcome = Result(name, float(value), op, float(goal), detail, low, high, rounds)
        self.results.append(outcome)
        return outcome

    def ratio(self, name: str, numerator: Timing, denominator: Timing, op: str, goal: float, detail: str = "") -> Result:
        """median(numerator) / median(denominator), with the lowest and highest ratio of the paired rounds."""
        rounds = sum(1 for d in denominator.samples[: len(numerator.samples)] if d)
        return self.result(
            name,
            numerator.median / denominator.median,
            op,
            goal,
            detail,
            interval=ratio_spread(numerator, denominator),
            rounds=rounds,
        )

    def note(self, text: str) -> None:
        print(f"note: {text}")
        self.notes.append(text)

    def to_dict(self, started: dt.datetime, seconds: float, command: str) -> dict:
        return {
            "benchmark": self.name,
            "quick": self.quick,
            "command": command,
            "date": started.isoformat(timespec="seconds"),
            "wall_s": round(seconds, 2),
            "machine": machine(),
            "params": self.params,
            "figures": self.figures,
            "results": [asdict(r) | {"met": r.met, "line": r.line()} for r in self.results],
            "notes": self.notes,
        }


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_end": [round(x, 2) for x in load] if load else None,
    }


def results_path(name: str, quick: bool, results_dir: Path | None = None) -> Path:
    folder = Path(results_dir or os.environ.get("DGX_BENCH_RESULTS") or RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / (f"{name}.quick.json" if quick else f"{name}.json")


def parser(description: str | None, repeats: int = 3) -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--quick", action="store_true", help="tiny inputs, fewer repeats: a smoke run of a minute or two")
    cli.add_argument("--repeats", type=int, default=None, help=f"timed repeats per side (default: {repeats}, quick: 2)")
    cli.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default bench/results)")
    return cli


def main(
    name: str,
    run: Callable[[Report, argparse.Namespace], None],
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
    repeats: int = 3,
) -> int:
    """Parse the flags, run the benchmark, print the RESULT lines and write the JSON. Exit code 0 unless it broke.

    `repeats` is the full run's default number of rounds; a noisy benchmark asks for more.
    """
    cli = parser(description, repeats)
    if add_arguments:
        add_arguments(cli)
    args = cli.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else repeats
    if args.repeats < 1:
        cli.error("--repeats must be at least 1")
    prepare_environment()
    report = Report(name, quick=args.quick)
    report.params["repeats"] = args.repeats
    command = " ".join(["python -m", f"bench.{name}", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    started, clock = dt.datetime.now().astimezone(), time.perf_counter()
    print(f"== bench.{name} {'(quick) ' if args.quick else ''}started {started:%Y-%m-%d %H:%M:%S}", flush=True)
    failed = None
    try:
        run(report, args)
    except Mismatch as error:
        failed = f"MISMATCH: {error}"
    except Exception as error:  # the JSON still records what broke, for run_all's summary
        traceback.print_exc()
        failed = f"ERROR: {type(error).__name__}: {error}"
    seconds = time.perf_counter() - clock
    record = report.to_dict(started, seconds, command)
    if failed:
        record["error"] = failed
        print(failed, file=sys.stderr)
    path = results_path(name, args.quick, args.results_dir)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    for outcome in report.results:
        print(outcome.line(), flush=True)
    missed = [outcome.name for outcome in report.results if not outcome.met]
    if missed:
        print(f"goals missed: {', '.join(missed)}", flush=True)
    print(f"== bench.{name} done in {seconds:.1f}s; wrote {path}", flush=True)
    return 1 if failed else 0
