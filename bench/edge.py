"""Edge model: the int8 TFLite model against the Keras model it came from, on the same test images.

Project: `dgx_assets.edge.build.build_edge_model` (what the edge_model asset runs): int8 conversion
calibrated on training images, then parity on the test split, the TFLite model fed decoded raw 300x300
pixels in `ai_edge_litert` (resize and normalisation inside the model, as a device runs it) and the Keras
model fed the image_features tensors it was evaluated on, one image at a time (compiled, batch of one),
both on one CPU thread by default (`--threads`): two-thread TFLite on a 2-core machine shared with other
work swings between 1 and 4 ms per image, one thread does not.

The lake it reads is built here with the project's own plain-Python steps (no Spark): raw_images rows
from `ingest.images.inspect_image`, image_features from `training.features.compute_features` (the default
224x224 grey tensors with their EfficientNet-Lite0 embeddings), and trained_model from
`training.train.train_classifier` with the default `TrainConfig()` (ImageNet EfficientNet-Lite0 fine-tuned
from block 9, head warm-started on the stored embeddings) but only 2 epochs on the first 1,200
ELPV images when installed (quick: 160 images, 1 epoch), else on synthetic cells: a
benchmark-sized model, not the demo's (fewer images and epochs than `make demo` trains: its accuracy is
lower, the conversion, size and latency are the same network's). `--lake DIR` measures an existing lake
instead (e.g. the one `make demo` filled); `--images`/`--epochs` change the size.

Goals: TFLite size <= 0.3 x the .keras file, CPU latency per image <= 0.5 x Keras's, and the edge_model
parity gate's aggregate criteria: accuracy within one point of Keras's and at most 2 % negative flips (images
Keras gets right and the edge model wrong). The format is the one the ladder ships (`quantization: auto`: int8,
else float16, else float32); top-1 agreement is reported, not judged. Both sides run on the same test images
(checked); latency is re-measured `repeats` times. Last, the edge runtime's peak memory over the worst accepted
request of each format it takes (`edge-run --serve` in a fresh process each: 16-bit grey PNG and TIFF, 24-bit BMP
and JPEG, each filling the pixel budget) against the memory limit the KubeEdge manifest gives the pod.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import (
    REPO,
    Report,
    Timing,
    check,
    isolate_state,
    main,
    timed,
    work_dir,
)
from bench.data import elpv_available, synthetic_pixels

NAME = "edge"
# Affordable on 2 cores: one Lite0 fine-tuning epoch costs tens of ms per training image.
IMAGES, EPOCHS = 1_200, 2
QUICK_IMAGES, QUICK_EPOCHS = 160, 1


def source_images(limit: int | None) -> list[tuple[str, bytes, str]]:
    """(name, file bytes, label): the ELPV images, else synthetic PNG cells."""
    if elpv_available():
        from dgx_assets.demo_seed import elpv_records

        return [(r["file"].name, r["file"].read_bytes(), r["label"]) for r in elpv_records(limit)]
    import io

    from PIL import Image

    out = []
    for seed in range(limit or 2000):
        pixels, label = synthetic_pixels(seed)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "L").save(buffer, format="PNG")
        out.append((f"cell-{seed:06d}.png", buffer.getvalue(), label))
    return out


def build_lake(root: Path, limit: int | None, epochs: int) -> dict:
    """raw_images, image_features and trained_model, written with the project's plain-Python functions."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.fs as pafs

    from dgx_assets.ingest import images
    from dgx_assets.lake.store import Lake
    from dgx_assets.training.config import FeatureConfig, TrainConfig
    from dgx_assets.training.dataset import FeatureFiles
    from dgx_assets.training.features import FEATURE_SCHEMA, compute_features
    from dgx_assets.training.train import train_classifier

    shutil.rmtree(root, ignore_errors=True)
    tables = Lake(str(root)).tables
    raw = raw_images_frame(limit)
    commit_one_file(tables, "raw_images", pa.Table.from_pandas(raw, preserve_index=False))
    valid = raw[raw["status"] == images.VALID]
    seconds, features = timed(
        lambda: pd.concat([compute_features(valid.iloc[i : i + 64], FeatureConfig()) for i in range(0, len(valid), 64)])
    )
    # The table's own schema: a column that is null in every row (feature_error) has no type Iceberg can store.
    feature_table = pa.Table.from_pandas(features, schema=FEATURE_SCHEMA, preserve_index=False)
    feature_file = commit_one_file(tables, "image_features", feature_table)
    print(f"  {len(valid)} valid images, features in {seconds:.0f}s")

    files = FeatureFiles(pafs.LocalFileSystem(), (str(feature_file),))
    config = TrainConfig(epochs=epochs, patience=max(2, epochs // 3))
    with tempfile.TemporaryDirectory(prefix="bench-edge-ckpt-") as checkpoints:
        seconds, result = timed(lambda: train_classifier(files, config, checkpoints))
    print(f"  trained {len(result.epochs)} epochs in {seconds:.0f}s, test accuracy {result.test.metrics['accuracy']:.3f}")
    save_trained_model(root / "trained_model", result, feature_file, str(tables.snapshot("image_features").snapshot_id))
    head = result.head_warm_start
    return {
        "images": len(raw),
        "valid": len(valid),
        "backbone": config.backbone,
        "epochs_run": len(result.epochs),
        "head_warm_start": head.reason if head and head.used else f"not used: {head.reason if head else '-'}",
        "training_s": round(seconds, 1),
        "keras_test_accuracy_at_training": result.test.metrics["accuracy"],
    }


def raw_images_frame(limit: int | None):
    """raw_images rows of the benchmark's images, one batch `bench`, inspected as the ingest inspects them."""
    import pandas as pd

    from dgx_assets.ingest import images

    rows = []
    for name, content, label in source_images(limit):
        verdict = images.inspect_image(content, name)
        digest = images.sha256_hex(content)
        rows.append(
            {
                "path": f"file:/landing/bench/{label}/{name}",
                "batch": "bench",
                "label": label,
                "sha256": digest,
                **verdict.as_dict(),
                "split": images.split_for(digest),
                "content": content if verdict.status == images.VALID else None,
            }
        )
    return pd.DataFrame(rows)


def commit_one_file(tables, name: str, table) -> str:
    """One batch `bench` of the table, committed as the assets commit theirs; returns its file's path."""
    import pyarrow.parquet as pq

    from dgx_assets.lake.files import filesystem_for

    written = []

    def write(folder: str) -> list[str]:
        fs, path = filesystem_for(folder)
        fs.create_dir(path, recursive=True)
        pq.write_table(table, f"{path}/part-00000.parquet")
        written.append(f"{path}/part-00000.parquet")
        return [f"{folder}/part-00000.parquet"]

    tables.write_and_commit(name, table.schema, write, "bench")
    return written[0]


def save_trained_model(model_dir: Path, result, feature_file: str, feature_snapshot_id: str) -> None:
    """The model and the model_info.json that edge_model reads, as trained_model writes them."""
    model_dir.mkdir()
    result.model.save(model_dir / "model.keras")
    info = {
        "class_names": result.class_names,
        "input_shape": result.input_shape,
        "mlflow_run_id": None,
        "registered_model_name": "bench",
        "model_version": None,
        "feature_files": [str(feature_file)],
        "feature_snapshot_id": feature_snapshot_id,
        "test_metrics": result.test.metrics,
    }
    (model_dir / "model_info.json").write_text(json.dumps(info, indent=2, default=float))


def median_latency_ms(call, inputs: np.ndarray) -> float:
    import time

    call(inputs[:1])
    latencies = []
    for image in inputs:
        started = time.perf_counter()
        call(image[np.newaxis])
        latencies.append(time.perf_counter() - started)
    return float(np.median(latencies) * 1000)


def like_for_like(model, edge_model: bytes, data, threads: int | None, count: int) -> dict:
    """Where the edge model's time goes: the same work on both sides, with and without the in-model resize.

    The edge contract puts the 300x300 -> model-size resize inside the TFLite model, while parity times
    Keras on tensors image_features already resized. Here Keras also gets the resize (the same antialiased
    bilinear tf.image.resize), and TFLite is also converted without it (raw size = model size).
    """
    import tensorflow as tf

    from dgx_assets.edge import convert, parity

    height, width, channels = convert.model_input_shape(model)
    raw = data.test_raw[:count]
    features = data.test_features[:count]
    with_resize = tf.function(
        lambda x: model(
            tf.image.resize(tf.cast(x, tf.float32), (height, width), method="bilinear", antialias=True), training=False
        ),
        input_signature=[tf.TensorSpec([1, *raw.shape[1:]], tf.uint8)],
    )
    keras_with_resize = median_latency_ms(lambda x: with_resize(x).numpy(), raw)
    config = convert.EdgeConversionConfig(raw_height=height, raw_width=width, quantization="int8")
    calibration = [np.asarray(image) for image in data.test_features[:50]]
    no_resize = convert.convert_to_tflite(model, config, calibration)
    tflite_no_resize = float(np.median(parity.tflite_predict(no_resize, features, num_threads=threads).latencies_s) * 1000)
    single = tf.function(
        lambda x: model(x, training=False), input_signature=[tf.TensorSpec([1, height, width, channels], tf.float32)]
    )
    keras_no_resize = median_latency_ms(lambda x: single(x).numpy(), features.astype(np.float32))
    tflite_with_resize = float(np.median(parity.tflite_predict(edge_model, raw, num_threads=threads).latencies_s) * 1000)
    # TFLite's own RESIZE_BILINEAR (resize_method="bilinear": no antialiasing, so not the parity default).
    builtin = convert.convert_to_tflite(
        model,
        convert.EdgeConversionConfig(
            raw_height=raw.shape[1], raw_width=raw.shape[2], quantization="int8", resize_method="bilinear"
        ),
        [np.asarray(image) for image in data.representative[:50]],
    )
    tflite_builtin_resize = float(np.median(parity.tflite_predict(builtin, raw, num_threads=threads).latencies_s) * 1000)
    out = {
        "tflite_builtin_bilinear_resize_ms": round(tflite_builtin_resize, 3),
        "keras_model_input_ms": round(keras_no_resize, 3),
        "tflite_model_input_ms": round(tflite_no_resize, 3),
        "keras_with_resize_ms": round(keras_with_resize, 3),
        "tflite_with_resize_ms": round(tflite_with_resize, 3),
        "ratio_model_input": round(tflite_no_resize / keras_no_resize, 3),
        "ratio_with_resize": round(tflite_with_resize / keras_with_resize, 3),
    }
    print("like for like (ms per image): " + ", ".join(f"{k} {v}" for k, v in out.items()))
    return out


# The costliest accepted request of each camera format the station takes: its largest decoded image inside the
# pixel budget (which counts bytes), in the mode of most bytes a pixel the format carries.
WORST_REQUEST_MODES = {"PNG": "I;16", "TIFF": "I;16", "BMP": "RGB", "JPEG": "RGB"}


def worst_request(image_format: str, mode: str) -> bytes:
    """Noise (no compression helps it) filling the default pixel budget in `mode`, encoded as `image_format`."""
    import io

    from PIL import Image

    from dgx_assets.station.runtime import DEFAULT_MAX_PIXELS, bytes_per_pixel

    side = int((DEFAULT_MAX_PIXELS // bytes_per_pixel(mode)) ** 0.5)
    rng = np.random.default_rng(0)
    pixels = (
        rng.integers(0, 65535, (side, side), dtype=np.uint16)
        if mode == "I;16"
        else rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
    )
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format=image_format)
    return encoded.getvalue()


def request_peak_memory_mib(model_dir: Path, body: bytes) -> float:
    """VmHWM of a fresh `edge-run --serve` after one request: a process per request, so no peak hides another."""
    import urllib.request

    command = [sys.executable, "-m", "dgx_assets", "edge-run", "--model-dir", str(model_dir), "--serve", "--port", "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, text=True)
    try:
        url = server.stdout.readline().split(" on ", 1)[1].split()[0]  # "edge-run: serving DIR on http://HOST:PORT (...)"
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/classify", data=body), timeout=120) as reply:
            check(reply.status == 200, "the request at the pixel budget must be classified")
        with urllib.request.urlopen(url + "/healthz", timeout=30) as reply:
            return json.loads(reply.read())["peak_rss_bytes"] / 2**20
    finally:
        server.terminate()
        server.wait(30)


def report_request_peak_memory(report: Report, model_dir: Path) -> None:
    from dgx_assets.fleet.kubeedge import edge_deployment
    from dgx_assets.station.runtime import DEFAULT_FORMATS

    check(set(WORST_REQUEST_MODES) == set(DEFAULT_FORMATS), f"a worst request for each of {DEFAULT_FORMATS}")
    [container] = edge_deployment("m", "1")["spec"]["template"]["spec"]["containers"]
    pod_limit_mib = float(container["resources"]["limits"]["memory"].removesuffix("Mi"))
    for image_format, mode in WORST_REQUEST_MODES.items():
        body = worst_request(image_format, mode)
        print(f"edge runtime, worst {image_format} request: {mode}, {len(body) / 2**20:.1f} MiB")
        peak = request_peak_memory_mib(model_dir, body)
        report.result(f"edge_request_peak_mib_{image_format.lower()}", peak, "<=", pod_limit_mib)


def run(report: Report, args) -> None:
    isolate_state(NAME)
    from dgx_assets.edge.build import build_edge_model
    from dgx_assets.edge.config import EdgeModelConfig
    from dgx_assets.lake.store import Lake

    if not args.lake:
        root = build_lake_in_a_process(report, args)
    else:
        root = Path(args.lake)
        report.params["lake"] = str(root)

    threads = args.threads
    if threads:
        # Before TensorFlow runs anything: Keras gets the same number of cores as the TFLite interpreter.
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    lake = Lake(str(root))
    settings = EdgeModelConfig(
        num_threads=threads or None,
        max_test_images=0,
        representative_samples=20 if args.quick else 200,  # quick: a smoke run (.ci/run), not figures
        latency_images=10 if args.quick else 100,
    )
    report.params.update(num_threads=threads or "runtime defaults", quantization=settings.quantization)

    seconds, result = timed(lambda: build_edge_model(lake, settings, tracking_uri=None))
    first = result.report
    report.figure("build_edge_model_s", round(seconds, 1))
    check(
        first.images == len(result.data.test_raw) == len(result.data.test_features),
        "TFLite and Keras must see the same test images",
    )
    print(
        f"edge model ({result.ladder.shipped.format}) built in {seconds:.0f}s: {first.images} test images, "
        f"agreement {first.top1_agreement:.2%}, negative flips {first.negative_flip_rate:.2%}, "
        f"Keras {first.keras_accuracy:.2%} / TFLite {first.tflite_accuracy:.2%}"
    )

    # Batch-of-one latency swings with the neighbours' load on a shared machine: at least 5 runs.
    rounds = args.repeats if args.quick else max(args.repeats, 5)
    reports = [first, *repeat_parity(report, lake, root, result, settings, rounds - 1, threads or None)]
    keras_ms = Timing([r.keras_latency_ms / 1000 for r in reports])
    tflite_ms = Timing([r.tflite_latency_ms / 1000 for r in reports])
    latency_ratio = float(np.median([r.latency_ratio for r in reports]))
    accuracy_points = abs(first.keras_accuracy - first.tflite_accuracy) * 100
    report.figure("parity", first.to_dict())
    report.figure("keras_latency_per_image", keras_ms.to_dict())
    report.figure("tflite_latency_per_image", tflite_ms.to_dict())
    report.figure("latency_ratio_runs", [round(r.latency_ratio, 3) for r in reports])
    print(
        f"size: .keras {first.keras_size_bytes:,} B, .tflite {first.tflite_size_bytes:,} B "
        f"({report.figures['size_ratio_to_keras_without_optimizer']} of the .keras saved without its optimizer)"
    )
    print(
        f"latency per image (median of {settings.latency_images}, {len(reports)} runs): "
        f"Keras {keras_ms.median * 1000:.2f} ms, TFLite {tflite_ms.median * 1000:.2f} ms"
    )
    report.result("edge_size_ratio", first.size_ratio, "<=", 0.3)
    runs = [r.latency_ratio for r in reports]
    report.result("edge_latency_ratio", latency_ratio, "<=", 0.5, interval=(min(runs), max(runs)), rounds=len(runs))
    report.result("edge_accuracy_difference_points", accuracy_points, "<=", 1.0)
    report.figure("edge_format", result.ladder.shipped.format)
    report.figure("edge_top1_agreement_pct", round(first.top1_agreement * 100, 2))
    report.result("edge_negative_flip_rate_pct", first.negative_flip_rate * 100, "<=", 2.0)
    report_request_peak_memory(report, root / "edge_model")


def build_lake_in_a_process(report: Report, args) -> Path:
    """The benchmark's lake, trained in a process of its own with all cores: this one runs TensorFlow on
    `--threads` only."""
    limit = args.images or (QUICK_IMAGES if args.quick else IMAGES)
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    root = work_dir(NAME) / "lake"
    report.params.update(images_limit=limit, epochs=epochs, source="elpv" if elpv_available() else "synthetic")
    out = subprocess.run(
        [sys.executable, "-m", "bench.edge", "--build-lake", str(root), "--epochs", str(epochs)]
        + (["--images", str(limit)] if limit else []),
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"building the lake failed:\n{out.stderr[-3000:]}")
    print("\n".join(line for line in out.stdout.splitlines()[:-1] if line.startswith("  ")))
    report.figure("lake", json.loads(out.stdout.strip().splitlines()[-1]))
    return root


def repeat_parity(report: Report, lake, root: Path, result, settings, runs: int, threads: int | None) -> list:
    """The shipped model's parity and latency `runs` more times on the same images (the first measurement is
    the build's own), and the size and like-for-like figures that need the trained model."""
    from dgx_assets.edge.build import load_trained_model
    from tests.support.edge_parity import measure_parity

    first = result.report
    tflite_model = (root / "edge_model" / "model.tflite").read_bytes()
    reports = []
    with tempfile.TemporaryDirectory(prefix="bench-edge-") as tmp:
        trained = load_trained_model(lake, Path(tmp))
        # trained_model's .keras also stores the optimizer's state (Adam's moments of the fine-tuned blocks);
        # the same model saved without it says what the int8 model saves on the network alone.
        weights_only = Path(tmp) / "without_optimizer.keras"
        trained.model.save(weights_only)  # loaded with compile=False: no optimizer to save
        report.figure("size_ratio_to_keras_without_optimizer", round(first.tflite_size_bytes / weights_only.stat().st_size, 4))
        for _ in range(runs):
            again, _, _ = measure_parity(
                tflite_model,
                trained.model,
                raw_images=result.data.test_raw,
                keras_inputs=result.data.test_features,
                labels=result.data.test_labels,
                keras_size_bytes=trained.size_bytes,
                quantization=result.ladder.shipped.format,
                latency_images=settings.latency_images,
                num_threads=threads,
            )
            check(again.tflite_accuracy == first.tflite_accuracy, "the TFLite model changed its answers between runs")
            reports.append(again)
        report.figure("like_for_like", like_for_like(trained.model, tflite_model, result.data, threads, settings.latency_images))
    return reports


def add_arguments(cli) -> None:
    cli.add_argument("--lake", default=None, help="measure an existing lake (trained_model, raw_images, image_features)")
    cli.add_argument(
        "--images", type=int, default=None, help=f"ELPV images to use (default the first {IMAGES:,}; quick {QUICK_IMAGES})"
    )
    cli.add_argument("--epochs", type=int, default=None, help=f"fine-tuning epochs (default {EPOCHS}; quick {QUICK_EPOCHS})")
    cli.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for both TFLite and TensorFlow (default 1: one core each, as on a small edge "
        "device, and steady on a shared machine; 0: each runtime's default)",
    )
    cli.add_argument("--build-lake", default=None, help=argparse.SUPPRESS)


if __name__ == "__main__":
    if "--build-lake" in sys.argv:
        from bench.common import parser, prepare_environment

        cli = parser(None)
        add_arguments(cli)
        options = cli.parse_args()
        prepare_environment()
        print(json.dumps(build_lake(Path(options.build_lake), options.images, options.epochs), default=float))
        sys.exit(0)
    sys.exit(main(NAME, run, __doc__, add_arguments))
