"""Features: the image_features Spark job against one plain TensorFlow process with tf.data.

Project: `dgx_assets.training.features.build_image_features` (what the image_features asset runs) over one
raw_images partition, on the project's default local Spark profile with a warm session and warm Python
workers (TensorFlow already imported in them): decode, grey conversion, antialiased bilinear resize to
128x128, rounding to uint8, and the brightness/contrast/sharpness statistics, written as Parquet.
Baseline: one Python process reading the same raw_images Parquet with pyarrow and running the same decode,
conversion, resize, rounding and statistics as a `tf.data` pipeline (parallel map, batches of 64, graph
mode), then writing the same columns with pyarrow.

Before timing, the two outputs must hold the same images (by path) with tensors equal within one grey
level and statistics within 1e-3. Goal: project throughput >= 0.8 of the baseline's.
Inputs: the raw_images partition of 5,000 synthetic 300x300 images (quick: 200), ingested untimed here.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import numpy as np

from bench.common import Report, check, cpu_used, interleaved, isolate_state, main, ratio_spread, timed, work_dir
from bench.data import synthetic_landing

NAME = "features"


def spark_session():
    """The project's default local Spark session (`SparkResource()`), started once and kept."""
    import dagster as dg

    from dgx_assets.spark.resource import SparkResource

    with dg.build_resources({"spark": SparkResource()}) as resources:
        return resources.spark.spark_session


def ingest(spark, landing: Path, batch: str, out: Path) -> str:
    """raw_images for one batch via the project's Spark ingest (untimed input preparation)."""
    from pyspark.sql import functions as F

    from dgx_assets.ingest import spark_ingest

    uri = out.as_uri()
    if not (out / "_SUCCESS").exists():
        frame = spark_ingest.build_raw_images(spark, f"{landing.as_uri()}/{batch}", spark_ingest.IngestSettings())
        # `batch` is the hive folder in the lake; here one flat folder, so it is written as a column.
        spark_ingest.write_raw_images(frame.withColumn("batch", F.lit(batch)), uri)
    return uri


# --- the baseline -------------------------------------------------------------------------------------------


def baseline_features(raw_dir: Path, out_dir: Path, height: int, width: int) -> Path:
    """tf.data: the same decode, grey conversion, resize, rounding and statistics; pyarrow in and out."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    import tensorflow as tf

    table = ds.dataset(str(raw_dir), format="parquet").to_table(
        columns=["sha256", "path", "batch", "label", "split", "width", "height", "content"],
        filter=ds.field("status") == "valid",
    )

    def model_input(content):
        image = tf.io.decode_image(content, channels=3, dtype=tf.float32, expand_animations=False)
        image = tf.image.rgb_to_grayscale(image)
        image = tf.image.resize(image, [height, width], method="bilinear", antialias=True)
        return tf.cast(tf.round(tf.clip_by_value(image * 255.0, 0.0, 255.0)), tf.uint8)

    laplacian = tf.reshape(tf.constant([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]), [3, 3, 1, 1])

    def statistics(batch):
        grey = tf.cast(batch, tf.float32) / 255.0
        sharp = tf.math.reduce_variance(tf.nn.conv2d(grey, laplacian, strides=1, padding="VALID"), axis=[1, 2, 3])
        return batch, tf.stack([tf.reduce_mean(grey, [1, 2, 3]), tf.math.reduce_std(grey, [1, 2, 3]), sharp], axis=1)

    contents = table.column("content").to_numpy(zero_copy_only=False)
    data = (
        tf.data.Dataset.from_tensor_slices(contents)
        .map(model_input, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .batch(64)
        .map(statistics, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    tensors, stats = [], []
    for batch, batch_stats in data:
        tensors.extend(row.tobytes() for row in batch.numpy())
        stats.append(batch_stats.numpy())
    stats = np.concatenate(stats).astype(np.float64)
    out = table.drop(["content", "width", "height"]).append_column("source_width", table.column("width")) \
        .append_column("source_height", table.column("height")) \
        .append_column("tensor", pa.array(tensors, pa.binary())) \
        .append_column("tensor_shape", pa.array([[height, width, 1]] * len(tensors), pa.list_(pa.int32()))) \
        .append_column("brightness", pa.array(stats[:, 0])) \
        .append_column("contrast", pa.array(stats[:, 1])) \
        .append_column("sharpness", pa.array(stats[:, 2]))
    staging = out_dir.with_name(f".staging-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    pq.write_table(out, staging / "part-00000.zstd.parquet", compression="zstd")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return out_dir


# --- comparing ---------------------------------------------------------------------------------------------


def read_features(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(folder), format="parquet").to_table(
        columns=["path", "tensor", "brightness", "contrast", "sharpness"])
    rows = table.to_pydict()
    return {
        path: (np.frombuffer(tensor, np.uint8), np.array([b, c, s]))
        for path, tensor, b, c, s in zip(rows["path"], rows["tensor"], rows["brightness"], rows["contrast"], rows["sharpness"])
    }


def compare_outputs(project: Path, baseline: Path, expected: int) -> dict:
    ours, theirs = read_features(project), read_features(baseline)
    check(len(ours) == expected, f"image_features holds {len(ours)} rows for {expected} valid images")
    check(ours.keys() == theirs.keys(), "image_features and the baseline hold different images")
    worst_pixel, worst_stat, off_pixels, total = 0, 0.0, 0, 0
    for path, (tensor, stats) in ours.items():
        other_tensor, other_stats = theirs[path]
        check(tensor.shape == other_tensor.shape, f"{path}: tensor sizes {tensor.shape} vs {other_tensor.shape}")
        difference = np.abs(tensor.astype(int) - other_tensor.astype(int))
        worst_pixel = max(worst_pixel, int(difference.max()))
        off_pixels += int(np.count_nonzero(difference))
        total += difference.size
        worst_stat = max(worst_stat, float(np.max(np.abs(stats - other_stats))))
    check(worst_pixel <= 1, f"tensors differ by up to {worst_pixel} grey levels (allowed 1)")
    check(worst_stat <= 1e-3, f"statistics differ by up to {worst_stat:.2g} (allowed 1e-3)")
    print(f"  same {len(ours)} images; pixels off by one level: {off_pixels / total:.4%}; stats within {worst_stat:.1g}")
    return {"max_pixel_difference": worst_pixel, "share_of_pixels_off_by_one": off_pixels / total,
            "max_statistic_difference": worst_stat}


def run(report: Report, args) -> None:
    isolate_state(NAME)
    from dgx_assets.training.features import FeatureConfig, build_image_features

    count = args.images or (200 if args.quick else 5_000)
    config = FeatureConfig()
    report.params.update(images=count, tensor_shape=list(config.tensor_shape), batch_rows=config.batch_rows)
    folder = work_dir(NAME)
    seconds, spark = timed(spark_session)
    report.figure("spark_session_start_s", round(seconds, 2))

    landing, batch = synthetic_landing(count)
    raw_dir = folder / f"raw_images-{count}"
    raw_uri = ingest(spark, landing, batch, raw_dir)
    project_out, baseline_out = folder / "project_features", folder / "baseline_features"
    valid = spark.read.parquet(raw_uri).where("status = 'valid'").count()

    # Warm-up: the Python workers import TensorFlow on their first task; the baseline builds its graph.
    warm_landing, warm_batch = synthetic_landing(20)
    warm_raw = ingest(spark, warm_landing, warm_batch, folder / "raw_images-20")
    seconds, _ = timed(lambda: build_image_features(spark, warm_raw, (folder / "warm").as_uri(), config))
    report.figure("first_run_of_20_images_s", round(seconds, 2))
    print(f"first 20-image feature run (starts the Python workers, imports TensorFlow in them): {seconds:.1f}s")

    def run_project():
        summary = build_image_features(spark, raw_uri, project_out.as_uri(), config)
        check(summary.feature_rows == valid and summary.failed_rows == 0, f"feature job: {summary}")

    def run_baseline():
        baseline_features(raw_dir, baseline_out, config.image_height, config.image_width)

    run_project()
    run_baseline()
    report.figure("agreement", compare_outputs(project_out, baseline_out, valid))
    timings = interleaved({"project": run_project, "baseline": run_baseline}, args.repeats)
    ours, theirs = timings["project"], timings["baseline"]
    low, high = ratio_spread(theirs, ours)
    report.figure("project", ours.to_dict(valid))
    report.figure("baseline", theirs.to_dict(valid))
    report.figure("throughput_ratio_range", [round(low, 3), round(high, 3)])
    cpu = {"project": cpu_used(run_project), "baseline": cpu_used(run_baseline)}
    report.figure("cpu_seconds_by_process", cpu)
    print(f"CPU seconds by process: {cpu}")
    print(f"project (image_features on Spark): {ours.describe(valid, 'images')}")
    print(f"baseline (one tf.data process): {theirs.describe(valid, 'images')}")
    report.result("features_throughput_ratio", theirs.median / ours.median, ">=", 0.8)


def add_arguments(cli) -> None:
    cli.add_argument("--images", type=int, default=None, help="synthetic images (default 5,000; quick 200)")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
