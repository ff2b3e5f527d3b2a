"""Scale-out: a backfill of many batches in one run, and trained_model on two Spark workers.

Backfill. Project: one Dagster run over a range of 20 small landing batches (raw_images, its bounded multi-run
backfill policy: one run, one SparkSession). Baseline: what the same backfill cost before, one run per batch,
each in a fresh process that starts its own Spark. One-batch runs are timed on `--sample` batches and the
20-batch cost projected from their median (running all 20 would add minutes and say the same). Both sides
start a Python process and import the code location, so both pay that. Goal: backfill wall time <= 0.5x of the
projected one-run-per-batch time. Before timing counts as a win, both sides' tables must hold the same rows.

Distributed training. Project: `training.distributed.train_on_spark` on `local-cluster[2,1,1024]` (two
executors, two MultiWorkerMirroredStrategy workers on disjoint shards). Baseline: `train.train_classifier` in
one process on the same image_features files, config and epochs. Reported: the start-up overhead (first
training step after the call, minus the same for single-process training; the distributed side's includes
starting the executors and the TensorFlow worker processes, not the SparkSession) and both test accuracies.
Goal: accuracy within 1 point of single-process training. Inputs: synthetic 32x32 cells (tests' generator),
the small from-scratch CNN.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, Report, check, isolate_state, main, work_dir

NAME = "scale_out"
BATCHES = 20


def _materialize(lake: str, keys: list[str]) -> None:
    """One Dagster run of raw_images over `keys` in this (fresh) process: its own SparkSession."""
    import dagster as dg

    from dgx_assets.defs.ingest.assets import raw_images
    from dgx_assets.defs.resources import LakeResource, SparkResource
    from dgx_assets.partitions import image_batches
    from tests.support.backfill_tags import RANGE_END, RANGE_START

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, keys)
        tags = {RANGE_START: keys[0], RANGE_END: keys[-1]} if len(keys) > 1 else {}
        dg.materialize(
            [raw_images],
            instance=instance,
            partition_key=None if len(keys) > 1 else keys[0],
            tags=tags,
            resources={"spark": SparkResource(), "lake": LakeResource(root=lake)},
        )
        check(len(instance.get_runs()) == 1, "one run")


def _run_process(lake: str, keys: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bench.scale_out", "--materialize", lake, *keys],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def _rows(lake: str, keys: list[str]) -> list[tuple]:
    from pyiceberg.expressions import EqualTo

    from dgx_assets.lake.store import Lake

    store = Lake(lake)
    rows = []
    for key in keys:
        table = store.tables.scan("raw_images", ["path", "sha256", "status", "split"], EqualTo("batch", key))
        paths = [path.split("/landing/", 1)[1] for path in table.column("path").to_pylist()]  # each side's own lake
        rows += sorted(zip(paths, *(table.column(c).to_pylist() for c in ("sha256", "status", "split"))))
    return rows


def backfill(report: Report, args) -> None:
    from tests.imagefactory import write_batch

    root = work_dir(NAME)
    landing = root / "landing"
    keys = [f"b{i:02d}" for i in range(BATCHES)]
    for seed, key in enumerate(keys):
        write_batch(landing, key, seed=seed, bad=False)
    one_run_lake, per_batch_lake = str(root / "lake-backfill"), str(root / "lake-per-batch")
    for lake in (one_run_lake, per_batch_lake):
        Path(lake).mkdir(parents=True, exist_ok=True)
        os.symlink(landing, Path(lake) / "landing") if not (Path(lake) / "landing").exists() else None
    sample = keys[: args.sample]
    per_batch = [_run_process(per_batch_lake, [key]) for key in sample]
    whole = _run_process(one_run_lake, keys)
    check(_rows(one_run_lake, sample) == _rows(per_batch_lake, sample), "both sides ingested the same rows")
    projected = statistics.median(per_batch) * BATCHES
    report.figure("one_run_per_batch_s", [round(s, 1) for s in per_batch])
    report.figure("backfill_one_run_s", round(whole, 1))
    report.figure("projected_runs_per_batch_s", round(projected, 1))
    report.result(
        "backfill_vs_run_per_batch",
        whole / projected,
        "<=",
        0.5,
        f"{BATCHES} batches: {whole:.0f} s in one run vs {projected:.0f} s as {BATCHES} runs",
        interval=(whole / (max(per_batch) * BATCHES), whole / (min(per_batch) * BATCHES)),
        rounds=len(per_batch),
    )


def distributed(report: Report, args) -> None:
    import keras
    import pyarrow.fs as pafs
    from pyspark.sql import SparkSession

    from dgx_assets.training.config import FeatureConfig, TrainConfig
    from dgx_assets.training.dataset import FeatureFiles
    from dgx_assets.training.distributed import train_on_spark
    from dgx_assets.training.train import train_classifier
    from tests.support import training_data

    root = work_dir(NAME) / "features"
    paths = training_data.write_feature_partitions(
        root, FeatureConfig(image_height=32, image_width=32), rows_per_batch=args.rows, batches=("b0", "b1")
    )
    files = FeatureFiles(pafs.LocalFileSystem(), tuple(str(p) for p in paths))
    config = TrainConfig(backbone="scratch", width=8, epochs=args.epochs, patience=args.epochs, batch_size=16, augment=False)

    class FirstStep(keras.callbacks.Callback):
        at = None

        def on_train_batch_end(self, batch, logs=None):
            FirstStep.at = FirstStep.at or time.time()

    started = time.time()
    single = train_classifier(files, config, str(root / "ckpt-single"), extra_callbacks=[FirstStep()])
    single_first_step = FirstStep.at - started

    session_started = time.perf_counter()
    session = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    session_s = time.perf_counter() - session_started
    try:
        spread = train_on_spark(session, files, config, str(root / "ckpt-spark"))
    finally:
        session.stop()
    check(len(spread.workers) == 2 and all(w.steps > 0 for w in spread.workers), "two workers took steps")
    a_single, a_spark = single.test.metrics["accuracy"], spread.test.metrics["accuracy"]
    report.figure("test_images", int(single.test.metrics["images"]))
    report.figure(
        "single",
        {"first_step_s": round(single_first_step, 1), "accuracy": round(a_single, 4), "seconds": round(single.seconds, 1)},
    )
    report.figure(
        "spark_2_workers",
        {
            "first_step_s": round(spread.startup_seconds, 1),
            "accuracy": round(a_spark, 4),
            "seconds": round(spread.seconds, 1),
            "session_start_s": round(session_s, 1),
            "steps_per_worker": [w.steps for w in spread.workers],
            "shard_rows": [w.shard_rows for w in spread.workers],
        },
    )
    report.figure("startup_overhead_s", round(spread.startup_seconds - single_first_step, 1))
    report.result(
        "accuracy_gap_points",
        abs(a_spark - a_single) * 100,
        "<=",
        1.0,
        f"single {a_single:.1%}, spark x2 {a_spark:.1%} after {args.epochs} epochs",
    )


def run(report: Report, args) -> None:
    isolate_state(NAME)
    if args.quick:
        args.sample, args.rows, args.epochs = 1, 150, 4
    report.params.update({"batches": BATCHES, "sample": args.sample, "rows_per_batch": args.rows, "epochs": args.epochs})
    backfill(report, args)
    distributed(report, args)


def arguments(cli) -> None:
    cli.add_argument("--sample", type=int, default=3, help="one-batch runs timed for the baseline")
    cli.add_argument("--rows", type=int, default=500, help="synthetic rows per image_features batch (two batches)")
    cli.add_argument("--epochs", type=int, default=12)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--materialize":
        _materialize(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    sys.exit(main(NAME, run, __doc__, arguments))
