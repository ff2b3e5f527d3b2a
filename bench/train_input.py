"""Training input pipeline: images/s that training consumes streaming from Parquet vs from memory.

Project: `dgx_assets.training.dataset.make_dataset` over image_features Parquet files, as
`train_classifier` builds it for the training split (shuffled, flips and quarter turns, batches of 32).
Baseline: the same training tensors already in memory (numpy), through `tf.data.from_tensor_slices`
with the same shuffle buffer, batching and per-image step (`dataset.model_input_step`, the same
augmentation): the fastest a pipeline can feed this model.

Measured twice: the pipeline alone (one epoch iterated, no model: how fast it can feed), and what
training actually consumes (an epoch of `model.fit` on the project's default classifier, ImageNet
EfficientNet-Lite0 fine-tuned from block 9, compiled as `train_classifier` compiles it with the recipe's
learning rate, and fed as it feeds it: the dataset repeated, `steps_per_epoch` one pass over the split;
goal: at least 0.9 of the in-memory figure, i.e. the input pipeline does not starve the model).
Before timing, the unshuffled, unaugmented project dataset must yield exactly the in-memory tensors and
labels, in order.
Inputs: synthetic image_features Parquet in the default feature shape (uint8 224x224x1 tensors, two
labels, 70/15/15 splits), 600 rows in 4 files (quick: 120 rows). Fewer than before the pretrained
backbone: one Lite0 training epoch costs tens of ms per image on 2 cores, not the small CNN's few.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bench.common import (
    Report,
    check,
    interleaved,
    isolate_state,
    main,
    ratio_spread,
    timed,
    work_dir,
)

NAME = "train_input"
SEED = 42


def write_features(folder: Path, rows: int, shape: tuple[int, int, int], files: int = 4) -> list[str]:
    """Synthetic image_features Parquet, in the layout the feature job writes (made once per size)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dgx_assets.training.features import FEATURE_COLUMNS

    done = folder / "_DONE"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        per_file = -(-rows // files)
        for index in range(files):
            count = min(per_file, rows - index * per_file)
            labels = rng.integers(0, 2, count)
            bucket = rng.random(count)
            pixels = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
            pixels[labels == 1, 40:44, :, :] = 0  # a dark line marks the "defective" class
            columns = {
                "sha256": [f"{index:02d}{i:062x}" for i in range(count)],
                "path": [f"file:/bench/{index}/{i}.png" for i in range(count)],
                "batch": ["bench"] * count,
                "label": np.where(labels == 1, "defective", "functional").tolist(),
                "split": np.where(bucket < 0.15, "test", np.where(bucket < 0.3, "validation", "train")).tolist(),
                "source_width": [300] * count,
                "source_height": [300] * count,
                "tensor": [image.tobytes() for image in pixels],
                "tensor_shape": [list(shape)] * count,
                "brightness": pixels.mean(axis=(1, 2, 3)) / 255.0,
                "contrast": pixels.std(axis=(1, 2, 3)) / 255.0,
                "sharpness": [0.0] * count,
                "embedding": [None] * count,
                "feature_status": ["ok"] * count,
                "feature_error": [None] * count,
                "feature_device": ["cpu"] * count,
            }
            table = pa.table({name: columns[name] for name in FEATURE_COLUMNS})
            pq.write_table(table, folder / f"part-{index:05d}.zstd.parquet", compression="zstd")
        done.write_text(str(rows))
    return sorted(str(p) for p in folder.glob("*.parquet"))


def in_memory(files, index) -> tuple[np.ndarray, np.ndarray]:
    """The training split's tensors and label ids, read once into memory, in the dataset's scan order."""
    import pyarrow.dataset as pads

    table = files.dataset().to_table(
        columns=["tensor", "label"],
        filter=(pads.field("split") == "train") & (pads.field("feature_status") == "ok"),
    )
    ids = {name: i for i, name in enumerate(index.class_names)}
    images = np.stack([np.frombuffer(t, np.uint8).reshape(index.tensor_shape) for t in table.column("tensor").to_pylist()])
    labels = np.array([ids[label] for label in table.column("label").to_pylist()], dtype=np.int32)
    return images, labels


def memory_dataset(images: np.ndarray, labels: np.ndarray, batch: int, *, shuffle: bool, augment: bool, buffer: int):
    """The best-case pipeline: make_dataset's steps, from tensors already in memory."""
    import tensorflow as tf

    from dgx_assets.training.dataset import model_input_step

    data = tf.data.Dataset.from_tensor_slices((images, labels))
    if shuffle:
        data = data.shuffle(min(buffer, len(images)), seed=SEED, reshuffle_each_iteration=True)

    step = model_input_step(images.shape[1:], augment, SEED)
    return data.map(step, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)


def iterate(dataset) -> int:
    return sum(int(images.shape[0]) for images, _ in dataset)


def second_epoch_seconds(model, dataset, steps: int) -> float:
    """Seconds of one training epoch as `train_classifier` runs them.

    One `fit` over the repeated dataset with `steps_per_epoch`, so Keras keeps one iterator from epoch to
    epoch, as in training. Of its two epochs the second is counted: the first also fills the shuffle
    buffer (once per training), and a `fit`'s end shuts its iterator down (tens of seconds on 2 cores,
    see BENCHMARKS.md section 3), which training pays once and a `fit` per epoch would pay every epoch.
    """
    import time

    import keras

    starts, seconds = {}, []
    timer = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: starts.__setitem__(epoch, time.perf_counter()),
        on_epoch_end=lambda epoch, logs: seconds.append(time.perf_counter() - starts[epoch]),
    )
    model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=2, verbose=0, callbacks=[timer])
    return seconds[-1]


def cpu_per_image_ms(make, images: int, rounds: int = 2) -> float:
    """Process CPU time (all threads) one epoch of the pipeline alone costs, per image."""
    import time

    iterate(make())
    started = time.process_time()
    for _ in range(rounds):
        iterate(make())
    return (time.process_time() - started) / (rounds * images) * 1000


def run(report: Report, args) -> None:
    isolate_state(NAME)
    import keras
    import pyarrow.fs as pafs
    import tensorflow as tf

    from dgx_assets.training.config import FeatureConfig, TrainConfig
    from dgx_assets.training.dataset import FeatureFiles, make_dataset, scan_features
    from dgx_assets.training.model import build_classifier
    from dgx_assets.training.train import steps_per_epoch

    rows = args.rows or (120 if args.quick else 600)
    repeats = args.repeats
    shape = FeatureConfig().tensor_shape
    paths = write_features(work_dir(NAME) / f"features-{rows}-{'x'.join(map(str, shape))}", rows, shape)
    files = FeatureFiles(pafs.LocalFileSystem(), tuple(paths))
    index = scan_features(files)
    train_rows = index.rows("train")
    config = TrainConfig().resolved()  # the default backbone with its recipe's learning rate
    batch = config.batch_size
    report.params.update(
        rows=rows,
        train_images=train_rows,
        files=len(paths),
        batch_size=batch,
        tensor_shape=list(index.tensor_shape),
        shuffle_buffer=config.shuffle_buffer,
        backbone=config.backbone,
        trainable_from_block=config.trainable_from_block,
    )

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()  # as train_classifier runs
    images, labels = in_memory(files, index)
    check(len(images) == train_rows, f"{len(images)} in-memory images for {train_rows} training rows")

    # Same result: the streamed dataset (no shuffle, no augmentation) yields exactly the in-memory tensors.
    streamed = make_dataset(files, index, "train", batch)
    position = 0
    for batch_images, batch_labels in streamed:
        n = int(batch_images.shape[0])
        check(
            np.array_equal(batch_images.numpy(), images[position : position + n].astype(np.float32)),
            f"streamed tensors differ from the Parquet contents at rows {position}..{position + n}",
        )
        check(np.array_equal(batch_labels.numpy(), labels[position : position + n]), f"labels differ at row {position}")
        position += n
    check(position == train_rows, f"the streamed dataset yielded {position} of {train_rows} training images")
    print(f"  same {position} tensors and labels, in order")

    def project_dataset():
        return make_dataset(
            files, index, "train", batch, shuffle=True, augment=True, seed=SEED, shuffle_buffer=config.shuffle_buffer
        )

    def baseline_dataset():
        return memory_dataset(images, labels, batch, shuffle=True, augment=True, buffer=config.shuffle_buffer)

    # 1. The pipelines alone.
    for make in (project_dataset, baseline_dataset):
        check(iterate(make()) == train_rows, "an epoch must yield every training image")
    alone = interleaved({"project": lambda: iterate(project_dataset()), "baseline": lambda: iterate(baseline_dataset())}, repeats)
    report.figure("pipeline_project", alone["project"].to_dict(train_rows))
    report.figure("pipeline_in_memory", alone["baseline"].to_dict(train_rows))
    cpu = {
        name: round(cpu_per_image_ms(make, train_rows), 4)
        for name, make in (("project", project_dataset), ("in_memory", baseline_dataset))
    }
    report.figure("pipeline_cpu_ms_per_image", cpu)
    print(f"pipeline alone, Parquet stream: {alone['project'].describe(train_rows, 'images')}")
    print(f"pipeline alone, in memory: {alone['baseline'].describe(train_rows, 'images')}")
    print("CPU per image, pipeline alone (ms): " + ", ".join(f"{k} {v}" for k, v in cpu.items()))

    # 2. What training consumes: an epoch of model.fit on the project's classifier, fed as training feeds it.
    model = build_classifier(config.model, index.tensor_shape, len(index.class_names))
    model.compile(
        optimizer=keras.optimizers.Adam(config.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    warm, _ = timed(lambda: model.fit(baseline_dataset().take(4), epochs=1, verbose=0))
    report.figure("model_compile_and_first_steps_s", round(warm, 2))
    steps = steps_per_epoch(index, batch)
    fit = interleaved(
        {
            "project": lambda: second_epoch_seconds(model, project_dataset(), steps),
            "baseline": lambda: second_epoch_seconds(model, baseline_dataset(), steps),
        },
        repeats,
        self_timed=True,
    )
    ours, theirs = fit["project"], fit["baseline"]
    low, high = ratio_spread(theirs, ours)
    report.figure("training_project", ours.to_dict(train_rows))
    report.figure("training_in_memory", theirs.to_dict(train_rows))
    report.figure("training_ratio_range", [round(low, 3), round(high, 3)])
    # On a shared 2-core machine a neighbour can take a core for a whole epoch: the fastest epochs of each
    # side compare the pipelines with that taken out.
    report.figure("training_ratio_fastest_epochs", round(min(theirs.samples) / min(ours.samples), 3))
    pipeline_rate, model_rate = alone["project"].rate(train_rows), theirs.rate(train_rows)
    report.figure("pipeline_alone_over_training_rate", round(pipeline_rate / model_rate, 2))
    print(f"training, Parquet stream: {ours.describe(train_rows, 'images')}")
    print(f"training, in memory: {theirs.describe(train_rows, 'images')}")
    print(f"the stream alone runs {pipeline_rate / model_rate:.1f}x as fast as the model consumes")
    report.figure("pipeline_alone_ratio", round(alone["baseline"].median / alone["project"].median, 3))
    report.ratio("train_input_ratio", theirs, ours, ">=", 0.9)


def add_arguments(cli) -> None:
    cli.add_argument("--rows", type=int, default=None, help="image_features rows (default 600; quick 120)")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
