"""Ingest and validate: the raw_images asset on a warm SparkSession against a plain-Python process pool.

Project: `dg.materialize([raw_images])` for one landing batch, with the project's default local Spark
profile (`SparkResource()`), whose session stays up between runs as it does across the assets of a run;
the figure includes Dagster's run and the partition's Iceberg commit. Measured once per table writer:
`arrow` (the default: pyarrow in a pyspark Python data source) and `spark` (Spark's own Parquet writer).
Baseline: what a user would write by hand: a process pool of one worker per core, each reading its share
of the files, decoding each fully with Pillow, hashing it, and writing the same columns (content bytes
included) to one Parquet file per chunk with pyarrow, then renaming the folder into place.

Inputs: 5,000 synthetic 300x300 images (half grey PNG, half RGB JPEG), then the full ELPV set when
`elpv-dataset` is installed. Quick: 200 synthetic images. Before timing, both sides' tables must hold the
same rows: same files, labels, sizes, hashes, formats, sizes in pixels, modes, statuses, splits, and
content bytes whose hash is the row's hash. Goal: project throughput >= 0.8 of the baseline's.
The one-off Spark start-up (session, then the first tiny run that starts the Python workers) is reported.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.common import Report, check, cpu_used, interleaved, isolate_state, main, ratio_spread, timed, work_dir
from bench.data import elpv_landing, image_files, synthetic_landing

NAME = "ingest"
COMPARED = ["label", "size_bytes", "sha256", "format", "width", "height", "mode", "status", "split"]


# --- the baseline (runs in the pool's worker processes) -----------------------------------------------------


def _split(sha256: str, validation: float = 0.15, test: float = 0.15) -> str:
    bucket = int(sha256[:8], 16) / 0x1_0000_0000
    return "test" if bucket < test else "validation" if bucket < test + validation else "train"


def baseline_chunk(paths: list[str], out_file: str) -> int:
    """Read, decode with Pillow, hash; write one Parquet file of the same columns raw_images has."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from dgx_assets.ingest.spark_ingest import RAW_IMAGES_SCHEMA

    columns: dict[str, list] = {name: [] for name in RAW_IMAGES_SCHEMA.names}
    now = dt.datetime.now(dt.UTC)
    for path in paths:
        stat = os.stat(path)
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                fmt, (width, height), mode = image.format, image.size, image.mode
            status, reason = "valid", ""
        except Exception as error:
            fmt = width = height = mode = None
            status, reason = "decode_error", str(error)
        digest = hashlib.sha256(data).hexdigest()
        values = {
            "path": "file:" + path,
            "batch": os.path.basename(os.path.dirname(os.path.dirname(path))),
            "label": os.path.basename(os.path.dirname(path)),
            "size_bytes": len(data),
            "modified_at": dt.datetime.fromtimestamp(stat.st_mtime, dt.UTC),
            "sha256": digest,
            "format": fmt,
            "width": width,
            "height": height,
            "mode": mode,
            "status": status,
            "reason": reason,
            "split": _split(digest),
            "content": data if status == "valid" else None,
            "ingested_at": now,
        }
        for name, value in values.items():
            columns[name].append(value)
    pq.write_table(pa.table(columns, schema=RAW_IMAGES_SCHEMA), out_file, compression="zstd")
    return len(paths)


def _warm(_: int) -> int:
    import pyarrow.parquet  # noqa: F401
    from PIL import Image  # noqa: F401

    return os.getpid()


class Baseline:
    """A warm pool (started once, like the warm SparkSession) writing `<out>/batch=<key>/` atomically."""

    def __init__(self, workers: int):
        self.workers = workers
        # spawn: forking a process that runs a JVM gateway and Arrow threads can deadlock the child.
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        list(self.pool.map(_warm, range(workers * 2)))

    def run(self, files: list[Path], final: Path) -> Path:
        staging = final.with_name(f".staging-{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        chunks = self.workers * 4  # a few chunks per worker evens out uneven files and a busy core
        shares = [[str(p) for p in files[i::chunks]] for i in range(chunks)]
        jobs = [(share, str(staging / f"part-{i:05d}.zstd.parquet")) for i, share in enumerate(shares) if share]
        written = sum(self.pool.map(baseline_chunk, *zip(*jobs)))
        check(written == len(files), f"baseline wrote {written} of {len(files)} files")
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
        return final

    def close(self) -> None:
        self.pool.shutdown()


# --- the project's path -------------------------------------------------------------------------------------


class Project:
    def __init__(self, report: Report, lake_root: Path, writer: str = "arrow"):
        import dagster as dg

        from dgx_assets.defs.resources import LakeResource, SparkResource

        self.dg = dg
        self.lake_root = lake_root
        self.writer = writer
        self.instance_context = dg.instance_for_test()
        self.instance = self.instance_context.__enter__()
        self.spark = SparkResource()
        self.lake_resource = LakeResource
        seconds, _ = timed(self._start_spark)
        report.figure("spark_session_start_s", round(seconds, 2))
        print(f"Spark session start-up: {seconds:.1f}s")

    def _start_spark(self):
        with self.dg.build_resources({"spark": self.spark}) as resources:
            return resources.spark.spark_session.range(1).count()

    def materialize(self, landing: Path, batch: str):
        from dgx_assets.defs.ingest.assets import raw_images

        self.instance.add_dynamic_partitions("image_batches", [batch])
        lake = self.lake_resource(root=str(self.lake_root), landing=str(landing), table_writer=self.writer)
        result = self.dg.materialize(
            [raw_images],
            partition_key=batch,
            instance=self.instance,
            resources={"spark": self.spark, "lake": lake},
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        )
        check(result.success, f"raw_images failed for {batch}")
        return result

    def partition(self, batch: str):
        """The batch's data files in the table's current snapshot."""
        from dgx_assets.lake.store import Lake

        return Lake(str(self.lake_root)).tables.require("raw_images", batch)

    def close(self) -> None:
        self.instance_context.__exit__(None, None, None)


# --- comparing the two tables --------------------------------------------------------------------------------


def read_rows(dataset) -> dict[str, tuple]:
    """relative path -> the compared columns, with the content checked against the row's hash."""
    table = dataset.to_table(columns=["path", "content", *COMPARED])
    rows = {}
    for row in table.to_pylist():
        content = row.pop("content")
        if row["status"] == "valid":
            check(
                content is not None and hashlib.sha256(content).hexdigest() == row["sha256"],
                f"{row['path']}: the stored bytes do not hash to the row's sha256",
            )
        relative = "/".join(row.pop("path").split("/")[-2:])  # <label>/<file>
        rows[relative] = tuple(row[name] for name in COMPARED)
    return rows


def compare_outputs(project, baseline: Path, expected: int) -> None:
    import pyarrow.dataset as ds

    ours, theirs = read_rows(project.dataset()), read_rows(ds.dataset(str(baseline), format="parquet", partitioning=None))
    check(len(ours) == expected, f"raw_images holds {len(ours)} rows for {expected} files")
    check(ours.keys() == theirs.keys(), "raw_images and the baseline list different files")
    different = [key for key in ours if ours[key] != theirs[key]]
    check(
        not different,
        f"{len(different)} rows differ, e.g. {different[:1]}: {ours[different[0]] if different else ''} "
        f"vs {theirs[different[0]] if different else ''}",
    )
    statuses = {row[COMPARED.index("status")] for row in ours.values()}
    print(f"  same {len(ours)} rows on both sides (statuses {sorted(statuses)})")


def step_seconds(result) -> float:
    """Seconds inside the raw_images step itself (Dagster's STEP_SUCCESS duration)."""
    return sum(event.event_specific_data.duration_ms for event in result.get_step_success_events()) / 1000


def bench_batch(report: Report, key: str, project: Project, baseline: Baseline, landing: Path, batch: str, repeats: int) -> None:
    files = image_files(landing / batch)
    count = len(files)
    size = sum(p.stat().st_size for p in files)
    print(f"-- {key}: {count:,} files, {size / 1e6:.0f} MB")
    baseline_out = work_dir(NAME) / "baseline" / key / f"batch={batch}"
    steps: list[float] = []

    def run_project():
        steps.append(step_seconds(project.materialize(landing, batch)))

    run_project()  # first run of this batch: also checks the result before anything is timed
    baseline.run(files, baseline_out)
    compare_outputs(project.partition(batch), baseline_out, count)
    steps.clear()
    timings = interleaved({"project": run_project, "baseline": lambda: baseline.run(files, baseline_out)}, repeats)
    ours, theirs = timings["project"], timings["baseline"]
    low, high = ratio_spread(theirs, ours)  # throughput ratio = baseline time / project time
    step = sorted(steps)[len(steps) // 2]
    # Where the CPU goes (one more run of each side): the JVM's share is work the baseline never does.
    cpu = {"project": cpu_used(run_project), "baseline": cpu_used(lambda: baseline.run(files, baseline_out))}
    print(f"CPU seconds by process: {cpu}")
    report.figure(
        key,
        {
            "files": count,
            "megabytes": round(size / 1e6, 1),
            "project": ours.to_dict(count),
            "baseline": theirs.to_dict(count),
            "project_step_median_s": round(step, 3),
            "dagster_overhead_median_s": round(ours.median - step, 3),
            "throughput_ratio_range": [round(low, 3), round(high, 3)],
            "project_parquet_files": len(project.partition(batch).uris),
            "writer": project.writer,
            "cpu_seconds_by_process": cpu,
        },
    )
    print(f"project (raw_images): {ours.describe(count, 'images')}; inside the step {step:.2f}s")
    print(f"baseline (process pool): {theirs.describe(count, 'images')}")
    report.ratio(f"{key}_throughput_ratio", theirs, ours, ">=", 0.8)


def run(report: Report, args) -> None:
    isolate_state(NAME)
    count = args.images or (200 if args.quick else 5_000)
    workers = os.cpu_count() or 1
    report.params.update(images=count, image_size=300, workers=workers)
    datasets = [("ingest_synthetic", *synthetic_landing(count))]
    if not args.quick and not args.no_elpv:
        elpv = elpv_landing()
        if elpv:
            datasets.append(("ingest_elpv", *elpv))
        else:
            report.note("elpv-dataset is not installed: only the synthetic images were measured")

    lake_root = work_dir(NAME) / "lake"
    shutil.rmtree(lake_root, ignore_errors=True)
    started = time.perf_counter()
    project = Project(report, lake_root)
    warm_landing, warm_batch = synthetic_landing(20)
    seconds, _ = timed(lambda: project.materialize(warm_landing, warm_batch))
    report.figure("first_run_of_20_images_s", round(seconds, 2))
    report.figure("spark_one_off_startup_s", round(time.perf_counter() - started, 2))
    print(f"one-off start-up (session + first 20-image run that starts the Python workers): {time.perf_counter() - started:.1f}s")
    baseline = Baseline(workers)
    try:
        for key, landing, batch in datasets:
            for writer in args.writers.split(","):  # the product's default first; each is its own RESULT line
                project.writer = writer
                name = key if writer == "arrow" else f"{key}_{writer}_writer"
                bench_batch(report, name, project, baseline, landing, batch, args.repeats)
    finally:
        baseline.close()
        project.close()


def add_arguments(cli) -> None:
    cli.add_argument("--images", type=int, default=None, help="synthetic images (default 5,000; quick 200)")
    cli.add_argument("--no-elpv", action="store_true", help="skip the ELPV set even when it is installed")
    cli.add_argument("--writers", default="arrow,spark", help="the table writers to measure (LakeResource.table_writer)")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
