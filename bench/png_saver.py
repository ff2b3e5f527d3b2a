"""PNG saver memory: peak memory of the driver and of each executor while writing 10,000 and 100,000 images.

Project: the ernie_generated_images asset (`dg.materialize`) on the default local Spark profile, its
endpoints two serving processes started here (`ErnieServingResource(endpoints=...)`): executors call
them through the pooled client, check every image and write each PNG file as its batch completes.
Each count runs in a fresh process (fresh JVM and Python workers); this process samples the memory of
that process tree every 0.2 s: the Python driver, the JVM (in local mode the driver's JVM is also the
executor's) and every Spark Python worker (the executors' Python side). Per process the peak resident set
(VmHWM) is reported; "in all" is the peak of the summed proportional set sizes (PSS, so pages a forked
worker shares with its parent count once). The serving processes are not part of the saver and are left out.

Before the figures count, the table must hold one `valid` row per prompt and the PNG folder exactly one
file per prompt, the sampled files identical to the bytes in the table.
Goals: peak at 100,000 <= 1.2 x the peak at 10,000 (memory does not grow with the image count), and
under 1.2 GB in all. Quick: 500 and 5,000 images.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import REPO, Report, check, descendants, executable, isolate_state, main, work_dir
from bench.common import read_text as _read

NAME = "png_saver"
SIZE = 32
CLIENT_CONCURRENCY = 16  # requests in flight per Spark task: keeps the servers busy, so 100,000 images take minutes
GB = 1024**3


# --- memory of a process tree ------------------------------------------------------------------------------


def _kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def role(pid: int, driver: int) -> str | None:
    """What a process of the saver's tree is, from its executable (a shell that execs java changes it)."""
    if pid == driver:
        return "driver (Python)"
    exe = executable(pid)
    if exe.startswith("java"):
        return "driver+executor JVM"  # local mode: the driver's JVM runs the executor too
    if exe.startswith("python"):
        if "dgx_assets.serving" in _read(f"/proc/{pid}/cmdline"):
            return None  # a model server, not the saver
        return "executor Python worker"
    return None  # launcher shells (spark-submit, spark-class): negligible and short-lived


class MemorySampler(threading.Thread):
    """Samples a process tree until stopped: per-process peak RSS, peak of the summed PSS."""

    def __init__(self, root: int, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.interval_s = root, interval_s
        self.peaks: dict[int, dict] = {}
        self.peak_total_pss = 0
        self.samples = 0
        self.started = time.monotonic()
        self.driver_trace: list[tuple[float, int]] = []  # (seconds since start, driver RSS): when it grows
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval_s)
        self.sample()

    def sample(self) -> None:
        total = 0
        for pid in descendants(self.root):
            kind = role(pid, self.root)
            if kind is None:
                continue
            status = _read(f"/proc/{pid}/status")
            if not status:
                continue
            pss = _kib(_read(f"/proc/{pid}/smaps_rollup"), "Pss")
            total += pss
            entry = self.peaks.setdefault(pid, {"role": kind, "peak_rss": 0, "peak_pss": 0})
            entry["role"] = kind
            if pid == self.root:
                self.driver_trace.append((time.monotonic() - self.started, _kib(status, "VmRSS")))
            entry["peak_rss"] = max(entry["peak_rss"], _kib(status, "VmHWM"), _kib(status, "VmRSS"))
            entry["peak_pss"] = max(entry["peak_pss"], pss)
        self.peak_total_pss = max(self.peak_total_pss, total)
        self.samples += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


# --- the child: one run of the saver ------------------------------------------------------------------------


def write_prompts(path: Path, count: int) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "prompt", "width", "height", "seed", "label"])
        for index in range(count):
            writer.writerow(
                [f"cell-{index}", f"Electroluminescence image of solar cell number {index}", SIZE, SIZE, index, "defective"]
            )


def child(count: int, endpoints: list[str], out_dir: Path) -> dict:
    """In a fresh process: materialize ernie_generated_images for `count` prompts."""
    import logging

    import dagster as dg

    from dgx_assets.defs.generation.assets import ernie_generated_images
    from dgx_assets.defs.generation.resources import ErnieServingResource
    from dgx_assets.defs.resources import LakeResource, SparkResource
    from dgx_assets.lake.store import Lake

    logging.getLogger("dagster").setLevel(logging.WARNING)
    prompts = out_dir / "prompts.csv"
    write_prompts(prompts, count)
    lake = Lake(str(out_dir / "lake"))
    resources = {
        # DGX_BENCH_SPARK_CONF (JSON): Spark overrides for a diagnosis run; unset, the project's defaults.
        "spark": SparkResource(spark_conf=json.loads(os.environ.get("DGX_BENCH_SPARK_CONF") or "{}")),
        "lake": LakeResource(root=lake.root, prompts=str(prompts)),
        "ernie": ErnieServingResource(endpoints=",".join(endpoints), concurrency=CLIENT_CONCURRENCY),
    }
    started = time.perf_counter()
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [ernie_generated_images],
            instance=instance,
            resources=resources,
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        )
    check(result.success, "ernie_generated_images failed")
    return {"count": count, "seconds": time.perf_counter() - started}


def verify(count: int, out_dir: Path) -> dict:
    """What the saver wrote, read here and not in the measured process (so the check costs it no memory)."""
    from dgx_assets.generation.table import summarize, written_dataset
    from dgx_assets.lake.store import Lake

    lake = Lake(str(out_dir / "lake"))
    table = written_dataset(lake)
    summary = summarize(table)
    sample = table.head(20, columns=["file_name", "content", "png_path"]).to_pylist()
    png_dir = Path(lake.fs_path(sample[0]["png_path"])).parent  # the run's PNG folder
    files = sum(1 for _ in os.scandir(png_dir))
    same = all((png_dir / row["file_name"]).read_bytes() == row["content"] for row in sample)
    return {"summary": summary, "png_files": files, "sample_same": same}


def measure(count: int, endpoints: list[str], out_dir: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "bench.png_saver",
        "--child",
        str(count),
        "--endpoints",
        ",".join(endpoints),
        "--out",
        str(out_dir),
    ]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO))
    )
    sampler = MemorySampler(process.pid)
    sampler.start()
    stdout, stderr = process.communicate()
    sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"the saver run for {count} images failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    by_role: dict[str, list[int]] = {}
    for entry in sampler.peaks.values():
        by_role.setdefault(entry["role"], []).append(entry["peak_rss"])
    result["peak_rss_by_role"] = {kind: sorted(values, reverse=True) for kind, values in by_role.items()}
    result["peak_total_pss"] = sampler.peak_total_pss
    result["samples"] = sampler.samples
    trace = sampler.driver_trace
    if trace:
        duration = trace[-1][0] or 1.0
        peak_at = max(trace, key=lambda point: point[1])[0]
        # Driver RSS at each tenth of the run: growth at the very end is the driver reading results back.
        result["driver_rss_mb_by_tenth"] = [
            round(max((rss for at, rss in trace if at <= duration * tenth / 10), default=0) / 2**20) for tenth in range(1, 11)
        ]
        result["driver_peak_at_share_of_run"] = round(peak_at / duration, 3)
    return result


def run(report: Report, args) -> None:
    isolate_state(NAME)
    import shutil

    from dgx_assets.generation import launcher
    from tests.support.quick_generator import cached_quick_generator

    small, large = (500, 5_000) if args.quick else (10_000, 100_000)
    report.params.update(image_counts=[small, large], image_size=SIZE, servers=2, client_concurrency_per_task=CLIENT_CONCURRENCY)
    model_dir = cached_quick_generator()
    servers = launcher.start_local_servers(2, model_dir, log_dir=work_dir(NAME) / "logs")
    runs = {}
    try:
        endpoints = [server.url for server in servers]
        for count in (small, large):
            out_dir = work_dir(NAME) / f"lake-{count}"
            shutil.rmtree(out_dir, ignore_errors=True)
            print(f"-- {count:,} images")
            result = measure(count, endpoints, out_dir)
            result.update(verify(count, out_dir))
            shutil.rmtree(out_dir, ignore_errors=True)  # 100,000 PNG files: do not keep them
            summary = result["summary"]
            check(
                summary["prompts"] == count and summary["valid"] == count,
                f"{count} prompts gave {summary['valid']} valid rows of {summary['prompts']}: {summary['status_counts']}",
            )
            check(result["png_files"] == count, f"{result['png_files']} PNG files for {count} images")
            check(result["sample_same"], "PNG files differ from the bytes in the table")
            runs[count] = result
            roles = ", ".join(
                f"{kind} {max(values) / 2**20:.0f} MB" + (f" (x{len(values)})" if len(values) > 1 else "")
                for kind, values in result["peak_rss_by_role"].items()
            )
            print(
                f"   {count / result['seconds']:.0f} images/s; peak RSS: {roles}; "
                f"peak in all (PSS) {result['peak_total_pss'] / 2**20:.0f} MB"
            )
    finally:
        launcher.stop_servers(servers)

    report.figure("runs", {str(count): result for count, result in runs.items()})
    growth = runs[large]["peak_total_pss"] / runs[small]["peak_total_pss"]
    worst = max(runs[large]["peak_total_pss"], runs[small]["peak_total_pss"])
    report.figure(
        "peak_rss_growth_by_role",
        {
            kind: round(max(peaks) / max(runs[small]["peak_rss_by_role"][kind]), 3)
            for kind, peaks in runs[large]["peak_rss_by_role"].items()
            if kind in runs[small]["peak_rss_by_role"]
        },
    )
    report.result("png_saver_peak_growth", growth, "<=", 1.2)
    report.result("png_saver_peak_gb", worst / GB, "<=", 1.2)


def add_arguments(cli) -> None:
    # The measured child process's own flags (not for users).
    cli.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    cli.add_argument("--endpoints", default=None, help=argparse.SUPPRESS)
    cli.add_argument("--out", default=None, help=argparse.SUPPRESS)


if __name__ == "__main__":
    if "--child" in sys.argv:
        from bench.common import parser, prepare_environment

        cli = parser(None)
        add_arguments(cli)
        options = cli.parse_args()
        prepare_environment()
        print(json.dumps(child(options.child, options.endpoints.split(","), Path(options.out))))
        sys.exit(0)
    sys.exit(main(NAME, run, __doc__, add_arguments))
