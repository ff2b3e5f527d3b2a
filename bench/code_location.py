"""Code location and sensor: what the webserver, the daemon and every sensor tick pay to load and look.

1. `import dgx_assets.definitions` against `import dagster` alone, each in a fresh interpreter
   (goal: at most 1.5 times). Both are timed inside the child, so interpreter start-up is left out of
   both; the modules that definitions adds on top of dagster are listed from `-X importtime`.
2. One `landing_zone_sensor` tick (built with `dg.build_sensor_context` and a `LakeResource`, as the
   daemon runs it) over a landing zone of 100,000 files, against a bare `os.scandir` walk of the same
   tree collecting each file's size and mtime (goal: at most 2 times). Timed twice: a first tick, with
   an empty cursor, and a tick after every batch was requested, which finds nothing new.
   Before timing, the sensor's per-batch file counts must equal the walk's, the tick after the first
   must request every batch, and the idle tick must request none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.common import REPO, Report, Timing, check, interleaved, isolate_state, main, ratio_spread, work_dir

NAME = "code_location"
LABELS = ("defective", "functional")
IMPORT_PROBE = (
    "import json, sys, time\n"
    "started = time.perf_counter()\n"
    "import {module}\n"
    "seconds = time.perf_counter() - started\n"
    "heavy = [m for m in ('tensorflow', 'paddle', 'pyspark', 'great_expectations') if m in sys.modules]\n"
    "print(json.dumps({{'seconds': seconds, 'heavy': heavy, 'modules': len(sys.modules)}}))\n"
)


# --- imports ----------------------------------------------------------------------------------------------


def import_seconds(module: str) -> dict:
    """Import `module` in a fresh interpreter; seconds measured inside it, heavy modules it pulled in."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE.format(module=module)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def import_breakdown(limit: int = 12) -> list[dict]:
    """Top-level packages definitions imports beyond dagster's own, by cumulative import time (-X importtime)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import dagster; import dgx_assets.definitions"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.startswith("import time:") and "|" in line]
    # Everything after dagster's own line was imported for definitions, on top of dagster.
    dagster_end = max(i for i, line in enumerate(lines) if line.rstrip().endswith("| dagster"))
    extra = []
    for line in lines[dagster_end + 1 :]:
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not name.startswith(" ") and "." not in name.strip():
            extra.append({"module": name.strip(), "cumulative_ms": round(int(cumulative) / 1000, 1)})
    extra.sort(key=lambda item: -item["cumulative_ms"])
    return extra[:limit]


def bench_imports(report: Report, repeats: int) -> None:
    samples: dict[str, list[float]] = {"dagster": [], "dgx_assets.definitions": []}
    modules: dict[str, int] = {}
    for round_index in range(repeats):
        order = list(samples) if round_index % 2 == 0 else list(samples)[::-1]
        for module in order:
            probe = import_seconds(module)
            check(not probe["heavy"], f"importing {module} pulled in {probe['heavy']} (must stay out of the code location)")
            samples[module].append(probe["seconds"])
            modules[module] = probe["modules"]
            print(f"  [{round_index + 1}/{repeats}] import {module}: {probe['seconds']:.3f}s")
    dagster, definitions = Timing(samples["dagster"]), Timing(samples["dgx_assets.definitions"])
    low, high = ratio_spread(definitions, dagster)
    report.figure("import_dagster", dagster.to_dict() | {"modules": modules["dagster"]})
    report.figure("import_definitions", definitions.to_dict() | {"modules": modules["dgx_assets.definitions"]})
    report.figure("import_ratio_range", [round(low, 3), round(high, 3)])
    breakdown = import_breakdown()
    report.figure("import_added_by_definitions", breakdown)
    print(f"import dagster: {dagster.describe()}")
    print(f"import dgx_assets.definitions: {definitions.describe()}")
    print("added on top of dagster: " + ", ".join(f"{b['module']} {b['cumulative_ms']}ms" for b in breakdown[:6]))
    report.ratio("import_definitions_vs_dagster", definitions, dagster, "<=", 1.5)


# --- the landing zone and the sensor ----------------------------------------------------------------------


def landing_zone(files: int, batches: int) -> Path:
    """`<landing>/<batch>/<label>/<file>` with `files` small files, made once and reused (marker file)."""
    root = work_dir(NAME) / f"landing-{files}"
    done = root.with_name(root.name + ".done")
    if done.exists():
        return root
    print(f"writing a landing zone of {files:,} files under {root} (once)")
    per_folder = files // (batches * len(LABELS))
    payload = b"\x89PNG\r\n\x1a\n" + b"\0" * 56  # a few bytes: the sensor only lists, it never reads
    for batch in range(batches):
        for label in LABELS:
            folder = root / f"batch-{batch:03d}" / label
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_folder):
                with open(folder / f"img-{index:06d}.png", "wb") as out:
                    out.write(payload)
    done.write_text(str(files))
    return root


def scandir_walk(root: str) -> dict[str, list[tuple[str, int, int]]]:
    """The bare baseline: every file's (path, size, mtime) per batch folder, with os.scandir."""
    per_batch: dict[str, list[tuple[str, int, int]]] = {}
    with os.scandir(root) as top:
        for batch in top:
            if batch.is_dir() and not batch.name.startswith((".", "_")):
                found = per_batch.setdefault(batch.name, [])
                stack = [batch.path]
                while stack:
                    with os.scandir(stack.pop()) as entries:
                        for entry in entries:
                            if entry.name.startswith((".", "_")):
                                continue
                            if entry.is_dir():
                                stack.append(entry.path)
                            else:
                                stat = entry.stat()
                                found.append((entry.path, stat.st_size, stat.st_mtime_ns))
    return per_batch


def sensor_tick(instance, lake_resource, cursor: str | None):
    import dagster as dg

    from dgx_assets.defs.ingest.sensors import landing_zone_sensor

    context = dg.build_sensor_context(cursor=cursor, instance=instance, resources={"lake": lake_resource})
    return landing_zone_sensor(context)


def bench_sensor(report: Report, repeats: int, files: int, batches: int) -> None:
    import logging

    import dagster as dg

    from dgx_assets.defs.resources import LakeResource
    from dgx_assets.ingest.landing import scan_landing

    logging.disable(logging.INFO)  # the sensor's "not ready yet" line, once per tick, naming every batch
    landing = landing_zone(files, batches)
    lake_resource = LakeResource(root=str(work_dir(NAME) / "lake"), landing=str(landing))

    walked = scandir_walk(str(landing))
    scanned = scan_landing(str(landing))
    found = sum(len(v) for v in walked.values())
    check(found == files, f"the walk found {found} files, wrote {files}")
    check(
        {name: len(v) for name, v in walked.items()} == {name: s.files for name, s in scanned.items()},
        "the sensor's per-batch file counts differ from the os.scandir walk",
    )

    with dg.instance_for_test() as instance:
        first = sensor_tick(instance, lake_resource, None)
        check(not first.run_requests, "a first look must wait for batches to settle, not request runs")
        ready = sensor_tick(instance, lake_resource, first.cursor)
        check(
            sorted(r.partition_key for r in ready.run_requests) == sorted(walked),
            f"the second tick requested {len(ready.run_requests)} runs for {len(walked)} settled batches",
        )
        idle_cursor = ready.cursor
        idle = sensor_tick(instance, lake_resource, idle_cursor)
        check(not idle.run_requests, "a tick with nothing new requested runs")
        report.figure("cursor_bytes", len(idle_cursor))

        timings = interleaved(
            {
                "scandir walk": lambda: scandir_walk(str(landing)),
                "sensor first tick": lambda: sensor_tick(instance, lake_resource, None),
                "sensor idle tick": lambda: sensor_tick(instance, lake_resource, idle_cursor),
            },
            repeats,
        )
    logging.disable(logging.NOTSET)
    walk, first_tick, idle_tick = timings["scandir walk"], timings["sensor first tick"], timings["sensor idle tick"]
    report.figure("landing_files", files)
    report.figure("landing_batches", batches)
    report.figure("scandir_walk", walk.to_dict(files))
    report.figure("sensor_first_tick", first_tick.to_dict(files))
    report.figure("sensor_idle_tick", idle_tick.to_dict(files))
    listing = Timing([timed_scan(str(landing)) for _ in range(max(1, repeats // 2))])
    report.figure("scan_landing_only", listing.to_dict(files))
    for label, timing in timings.items():
        print(f"{label}: {timing.describe(files, 'files')}")
    print(f"of which scan_landing (listing + fingerprint): {listing.describe(files, 'files')}")
    report.ratio("sensor_tick_vs_scandir", first_tick, walk, "<=", 2.0)
    report.ratio("sensor_idle_tick_vs_scandir", idle_tick, walk, "<=", 2.0)


def timed_scan(landing: str) -> float:
    import time

    from dgx_assets.ingest.landing import scan_landing

    started = time.perf_counter()
    scan_landing(landing)
    return time.perf_counter() - started


def run(report: Report, args) -> None:
    isolate_state(NAME)
    files = args.files or (2_000 if args.quick else 100_000)
    batches = 4 if args.quick else 10
    repeats = args.repeats if not args.quick else max(args.repeats, 3)
    report.params.update(files=files, batches=batches)
    bench_imports(report, repeats=max(repeats, 5 if args.quick else 11))  # imports are cheap: more repeats beat the noise
    bench_sensor(report, repeats, files, batches)


def add_arguments(cli) -> None:
    cli.add_argument("--files", type=int, default=None, help="landing zone size (default 100,000; quick 2,000)")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
