"""Stream image_features Parquet files into ``tf.data`` without loading the dataset into memory.

Only the small columns (label, split, status, shape) are scanned up front, to learn the classes, the
split sizes and the tensor shape. Tensors are then read record batch by record batch with the split
filter pushed into the Parquet scan; each batch goes to TensorFlow as one uint8 array that views the
binary column's buffer, and TensorFlow splits it into examples.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

SPLITS = ("train", "validation", "test")
_SCAN_ROWS = 256


class FeatureDataError(ValueError):
    """The image_features files cannot train a classifier; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class FeatureFiles:
    """The exact Parquet files a training run reads, on one filesystem: the data files of one snapshot of the
    image_features table (`of_snapshot`), named in the run's lineage so the same set can be read again."""

    filesystem: pafs.FileSystem
    paths: tuple[str, ...]
    table: str | None = None  # the Iceberg table, dgx.<name>
    snapshot_id: int | None = None

    @classmethod
    def of_snapshot(cls, snapshot: Any) -> FeatureFiles:
        """The files of a `catalog.TableSnapshot` (`Lake(root).tables.snapshot("image_features", snapshot_id)`)."""
        from dgx_assets.lake.tables import NAMESPACE

        return cls(snapshot.filesystem, snapshot.paths, f"{NAMESPACE}.{snapshot.table}", snapshot.snapshot_id)

    def dataset(self) -> pads.Dataset:
        return pads.dataset(list(self.paths), filesystem=self.filesystem, format="parquet")


def current_features(lake: Any) -> tuple[FeatureFiles, tuple[str, ...], Any]:
    """The current snapshot of the image_features table: its files, its batches and the `catalog.TableSnapshot`."""
    snapshot = lake.tables.snapshot("image_features")
    if not snapshot.uris:
        raise FeatureDataError("the table image_features holds no data: materialize image_features first")
    return FeatureFiles.of_snapshot(snapshot), tuple(lake.tables.partitions("image_features", snapshot.snapshot_id)), snapshot


@dataclasses.dataclass(frozen=True)
class FeatureIndex:
    class_names: tuple[str, ...]
    tensor_shape: tuple[int, int, int]
    counts: dict[str, dict[str, int]]  # split -> label -> usable rows
    failed_rows: int  # rows image_features could not turn into tensors (skipped)

    def rows(self, split: str) -> int:
        return sum(self.counts.get(split, {}).values())

    def label_counts(self, split: str) -> list[int]:
        return [self.counts.get(split, {}).get(name, 0) for name in self.class_names]

    def class_weights(self) -> dict[int, float]:
        """Inverse class frequency on the training split, normalised so a balanced set gets 1.0."""
        counts = self.label_counts("train")
        total, classes = sum(counts), len(counts)
        return {i: (total / (classes * n) if n else 0.0) for i, n in enumerate(counts)}


def scan_features(files: FeatureFiles) -> FeatureIndex:
    """Classes, per-split counts and the tensor shape, from the small columns only."""
    if not files.paths:
        raise FeatureDataError("no image_features Parquet files to train on: materialize image_features first")
    table = files.dataset().to_table(columns=["label", "split", "feature_status", "tensor_shape"])
    ok = [status == "ok" for status in table.column("feature_status").to_pylist()]
    labels = table.column("label").to_pylist()
    splits = table.column("split").to_pylist()
    shapes = {tuple(shape) for shape, good in zip(table.column("tensor_shape").to_pylist(), ok) if good}
    if len(shapes) != 1:
        raise FeatureDataError(
            f"image_features partitions hold tensors of different shapes {sorted(shapes)}: "
            "re-materialize every image_features partition with the same image_height/image_width/channels"
            if shapes
            else "image_features holds no usable tensors (every row has feature_status 'error')"
        )
    counts: dict[str, Counter] = {split: Counter() for split in SPLITS}
    for label, split, good in zip(labels, splits, ok):
        if good and split in counts:
            counts[split][label] += 1
    # Production images (split `unlabelled`, no label) are scored, never learnt from: they name no class.
    class_names = tuple(sorted({label for label, split, good in zip(labels, splits, ok) if good and split in counts}))
    height, width, channels = shapes.pop()
    index = FeatureIndex(
        class_names=class_names,
        tensor_shape=(int(height), int(width), int(channels)),
        counts={split: dict(sorted(c.items())) for split, c in counts.items()},
        failed_rows=ok.count(False),
    )
    if len(class_names) < 2:
        raise FeatureDataError(f"need at least two labels to train a classifier, found {list(class_names)}")
    for split in SPLITS:
        if index.rows(split) == 0:
            raise FeatureDataError(f"the {split!r} split of image_features is empty: ingest more images")
    missing = [name for name, n in zip(class_names, index.label_counts("train")) if n == 0]
    if missing:
        raise FeatureDataError(f"labels {missing} have no training images")
    return index


@dataclasses.dataclass(frozen=True)
class Shard:
    """The part of the feature files one of ``of`` training workers reads, disjoint from the others' parts:
    whole Parquet row groups ((path, row group) pairs), or, with fewer row groups than workers, every
    ``of``-th row of the scan."""

    index: int
    of: int
    row_groups: tuple[tuple[str, int], ...] | None = None

    def record_batches(self, files: FeatureFiles, paths: list[str], columns: list[str], scan_filter: Any):
        if self.row_groups is None:
            dataset = pads.dataset(paths, filesystem=files.filesystem, format="parquet")
            seen = 0
            for batch in dataset.to_batches(columns=columns, filter=scan_filter, batch_size=_SCAN_ROWS, use_threads=False):
                first = (self.index - seen) % self.of  # the first row of this batch that is ours
                seen += batch.num_rows
                yield batch.take(pa.array(range(first, batch.num_rows, self.of), pa.int64()))
            return
        groups: dict[str, list[int]] = {}
        for path, group in self.row_groups:
            groups.setdefault(path, []).append(group)
        parquet = pads.ParquetFileFormat()
        for path in (p for p in paths if p in groups):
            fragment = parquet.make_fragment(path, filesystem=files.filesystem, row_groups=sorted(groups[path]))
            yield from fragment.to_batches(columns=columns, filter=scan_filter, batch_size=_SCAN_ROWS, use_threads=False)


def make_dataset(
    files: FeatureFiles,
    index: FeatureIndex,
    split: str,
    batch_size: int,
    *,
    shuffle: bool = False,
    augment: bool = False,
    seed: int = 0,
    shuffle_buffer: int = 2048,
    shard: Shard | None = None,
    soft_targets: str | None = None,
    one_hot: bool = False,
    balance_classes: bool = False,
) -> Any:
    """Batches of (float32 pixels 0..255, int32 label index) for ``split`` (of one ``shard`` of it: then of
    unknown length). With ``soft_targets``, the name of a column holding each row's probability of the
    positive class, the second element is float32 [rows, classes] class probabilities instead; with
    ``one_hot``, those probabilities are the labels' 0 and 1. With ``balance_classes`` every class comes
    equally often by its label (also under graded targets), its images repeated or skipped, and the stream has
    no fixed length."""
    import tensorflow as tf

    columns = ["tensor", "label", *([soft_targets] if soft_targets else [])]
    targets = _target_reader(index, soft_targets, one_hot)
    class_names = pa.array(index.class_names, pa.string())
    scan_filter = (pads.field("split") == split) & (pads.field("feature_status") == "ok")
    shape = index.tensor_shape
    epochs = iter(range(1 << 30))

    def record_batches():
        # A new file order each epoch, the same sequence of orders on every run with this seed.
        rng = np.random.default_rng([seed, next(epochs)])
        paths = list(files.paths)
        if shuffle:
            rng.shuffle(paths)
        if shard is not None:
            batches = shard.record_batches(files, paths, columns, scan_filter)
        else:
            batches = pads.dataset(paths, filesystem=files.filesystem, format="parquet").to_batches(
                columns=columns, filter=scan_filter, batch_size=_SCAN_ROWS, use_threads=False
            )
        for batch in batches:
            if batch.num_rows:
                element = (_pixel_block(batch.column("tensor"), shape), targets(batch))
                # The resampler classes rows by their label: a graded target's argmax need not be it.
                yield (*element, _label_ids(batch.column("label"), class_names)) if balance_classes else element

    # Whole record batches cross into TensorFlow and unbatch() splits them there: a Python call and an
    # array per image cost three times the CPU of reading from memory, and that CPU is the model's.
    dense = soft_targets is not None or one_hot
    label_spec = tf.TensorSpec((None,), tf.int32)
    target_spec = tf.TensorSpec((None, len(index.class_names)), tf.float32) if dense else label_spec
    signature = (tf.TensorSpec((None, *shape), tf.uint8), target_spec, *([label_spec] if balance_classes else []))
    data = tf.data.Dataset.from_generator(record_batches, output_signature=signature).unbatch()
    if shard is None:
        data = data.apply(tf.data.experimental.assert_cardinality(index.rows(split)))
    if shuffle:
        data = data.shuffle(min(shuffle_buffer, index.rows(split)), seed=seed, reshuffle_each_iteration=True)
    if balance_classes:
        data = _balanced(data, index, split, seed)

    step = model_input_step(shape, augment, seed)
    return data.map(step, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _balanced(data: Any, index: FeatureIndex, split: str, seed: int) -> Any:
    """``data`` of (image, target, class index) resampled to equal class frequencies, from the split's known
    counts (no warm-up estimate); (image, target) out."""
    counts = np.asarray(index.label_counts(split), np.float64)
    classes = len(counts)
    resampled = data.rejection_resample(
        lambda image, target, label: label,
        target_dist=np.full(classes, 1 / classes),
        initial_dist=counts / counts.sum(),
        seed=seed,
    )
    return resampled.map(lambda label, element: element[:2])


def _target_reader(index: FeatureIndex, soft_targets: str | None, one_hot: bool):
    """Each record batch's targets as make_dataset yields them: class indices, or [rows, classes] probabilities."""
    class_names = pa.array(index.class_names, pa.string())
    if soft_targets:
        return _soft_targets(index, soft_targets)
    if one_hot:
        identity = np.eye(len(class_names), dtype=np.float32)
        return lambda batch: identity[_label_ids(batch.column("label"), class_names)]
    return lambda batch: _label_ids(batch.column("label"), class_names)


def _soft_targets(index: FeatureIndex, column: str):
    """[rows, 2] class probabilities from a column of P(positive class), for graded labels (ELPV's experts:
    0, 1/3, 2/3, 1)."""
    from dgx_assets.training.decision import positive_index

    positive = positive_index(index.class_names)
    if positive is None:
        raise FeatureDataError(f"soft targets need two classes, image_features has {list(index.class_names)}")

    def targets(batch: pa.RecordBatch) -> np.ndarray:
        values = batch.column(column)
        if values.null_count:
            raise FeatureDataError(f"{values.null_count} rows have no {column!r}: every row needs its soft target")
        p = values.to_numpy(zero_copy_only=False).astype(np.float32)
        if not ((p >= 0) & (p <= 1)).all():
            raise FeatureDataError(f"{column!r} holds values outside [0, 1]: it must be a probability")
        out = np.empty((len(p), 2), np.float32)
        out[:, positive], out[:, 1 - positive] = p, 1 - p
        return out

    return targets


def read_embeddings(
    files: FeatureFiles, index: FeatureIndex, split: str, sample_rows: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(embeddings [rows, dims] float32, class indices, the first ``sample_rows`` tensors) of ``split``,
    or None when image_features was built without embeddings. Small: 1,280 floats per image."""
    dataset = files.dataset()  # one discovery of the files' footers for the three reads below
    if "embedding" not in dataset.schema.names:
        return None
    scan_filter = (pads.field("split") == split) & (pads.field("feature_status") == "ok")
    table = dataset.to_table(columns=["embedding", "label"], filter=scan_filter)
    embeddings = table.column("embedding")
    if len(embeddings) == 0 or embeddings.null_count:
        return None
    flat = pc.list_flatten(embeddings).to_numpy(zero_copy_only=False).astype(np.float32)  # pyright: ignore[reportAttributeAccessIssue]
    vectors = flat.reshape(len(embeddings), -1)
    labels = _label_ids(table.column("label").combine_chunks(), pa.array(index.class_names, pa.string()))
    head = dataset.head(sample_rows, columns=["tensor"], filter=scan_filter).column("tensor")
    sample = _pixel_block(head.combine_chunks(), index.tensor_shape)
    return vectors, labels, sample


def model_input_step(shape: tuple[int, int, int], augment: bool, seed: int):
    """(uint8 image, label) -> (float32 image, label), with the training augmentation when `augment`.

    Shared with bench/train_input.py's in-memory baseline, so both sides do exactly the same work per image.
    """
    import tensorflow as tf

    def to_model_input(image, label):
        if augment:
            # Cells and wafers have no preferred orientation: flips (and quarter turns of square
            # images) are label-preserving. They only move pixels, so they move the uint8 image (a
            # quarter of the float32 bytes) and the cast comes after: the same values, less CPU.
            image = tf.image.random_flip_left_right(image, seed=seed)
            image = tf.image.random_flip_up_down(image, seed=seed + 1)
            if shape[0] == shape[1]:
                image = tf.image.rot90(image, k=tf.random.uniform([], 0, 4, dtype=tf.int32, seed=seed + 2))
        return tf.cast(image, tf.float32), label

    return to_model_input


def _pixel_block(tensors: pa.Array, shape: tuple[int, int, int]) -> np.ndarray:
    """One record batch's tensors as a (rows, *shape) uint8 array viewing the binary column's data buffer.

    Refuses (rather than reshapes into wrong images) a tensor that is missing or not ``shape``'s size.
    """
    size = math.prod(shape)
    if tensors.null_count:
        raise FeatureDataError(
            f"{tensors.null_count} image_features rows with feature_status 'ok' have no tensor: "
            "re-materialize their image_features partition"
        )
    offset_type = np.int64 if pa.types.is_large_binary(tensors.type) else np.int32
    _, offsets, data = tensors.buffers()
    offsets = np.frombuffer(offsets, offset_type)[tensors.offset : tensors.offset + len(tensors) + 1]
    wrong = np.flatnonzero(np.diff(offsets) != size)
    if len(wrong):
        raise FeatureDataError(
            f"{len(wrong)} image_features tensors are not {size} bytes (shape {list(shape)}), e.g. one of "
            f"{offsets[wrong[0] + 1] - offsets[wrong[0]]} bytes: re-materialize their image_features partition"
        )
    return np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]].reshape(len(tensors), *shape)


def _label_ids(labels: pa.Array, class_names: pa.Array) -> np.ndarray:
    """Each row's class index, looked up in Arrow for the whole batch."""
    ids = pc.index_in(labels, value_set=class_names)  # pyright: ignore[reportAttributeAccessIssue]
    if ids.null_count:
        unknown = pc.filter(labels, pc.is_null(ids))[0].as_py()  # pyright: ignore[reportAttributeAccessIssue]
        raise FeatureDataError(
            f"label {unknown!r} is not among the scanned classes {class_names.to_pylist()}: "
            "image_features changed while training; start the run again"
        )
    return ids.to_numpy().astype(np.int32, copy=False)
