"""make_dataset streams image_features Parquet record batch by record batch: the same tensors, labels and
order as the files hold, a fresh reproducible shuffle each epoch, and bad rows skipped or refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from support import training_data

from dgx_assets.training.config import FeatureConfig
from dgx_assets.training.dataset import (
    FeatureDataError,
    FeatureFiles,
    _pixel_block,
    make_dataset,
    scan_features,
)
from dgx_assets.training.features import compute_features

SHAPE = (32, 32, 1)
CONFIG = FeatureConfig(image_height=32, image_width=32)


def _parquet_rows(files: FeatureFiles, index, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's usable rows read directly with pyarrow, in file order: the reference."""
    table = files.dataset().to_table(
        columns=["tensor", "label"], filter=(pads.field("split") == split) & (pads.field("feature_status") == "ok")
    )
    images = np.stack([np.frombuffer(t, np.uint8).reshape(index.tensor_shape) for t in table["tensor"].to_pylist()])
    ids = {name: i for i, name in enumerate(index.class_names)}
    return images, np.array([ids[label] for label in table["label"].to_pylist()], np.int32)


def _stream(dataset) -> tuple[np.ndarray, np.ndarray]:
    images, labels = zip(*((x.numpy(), y.numpy()) for x, y in dataset))
    return np.concatenate(images), np.concatenate(labels)


def _as_multiset(images: np.ndarray) -> list[bytes]:
    return sorted(image.tobytes() for image in images)


def _symmetries(image: np.ndarray) -> list[np.ndarray]:
    """The eight flips and quarter turns of a square image."""
    return [np.rot90(flipped, k) for flipped in (image, image[::-1]) for k in range(4)]


@pytest.fixture(scope="module")
def many_batches(tmp_path_factory) -> FeatureFiles:
    """One file of 700 rows in row groups of 300: several record batches of uneven sizes per file."""
    rows = training_data.synthetic_raw_rows(700, "big", seed=7)
    features = compute_features(rows, CONFIG)
    path = tmp_path_factory.mktemp("features") / "part-00000.parquet"
    pq.write_table(pa.Table.from_pandas(features, preserve_index=False), path, row_group_size=300)
    return FeatureFiles(pafs.LocalFileSystem(), (str(path),))


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_stream_yields_exactly_the_parquet_rows_in_order(feature_files, many_batches, split):
    for files in (feature_files, many_batches):
        index = scan_features(files)
        expected_images, expected_labels = _parquet_rows(files, index, split)

        images, labels = _stream(make_dataset(files, index, split, batch_size=7))

        assert images.dtype == np.float32 and labels.dtype == np.int32
        assert np.array_equal(images, expected_images.astype(np.float32))
        assert np.array_equal(labels, expected_labels)


def test_shuffle_gives_each_epoch_a_new_order_the_same_on_every_run(feature_files):
    index = scan_features(feature_files)

    def epochs(dataset, count=2):
        return [_stream(dataset) for _ in range(count)]

    first = epochs(make_dataset(feature_files, index, "train", 16, shuffle=True, seed=3, shuffle_buffer=64))
    again = epochs(make_dataset(feature_files, index, "train", 16, shuffle=True, seed=3, shuffle_buffer=64))
    in_order, _ = _stream(make_dataset(feature_files, index, "train", 16))

    for (images, labels), (same_images, same_labels) in zip(first, again):
        assert np.array_equal(images, same_images) and np.array_equal(labels, same_labels)
    assert not np.array_equal(first[0][0], first[1][0])  # reshuffled between epochs
    assert not np.array_equal(first[0][0], in_order)
    for images, _ in first:  # every row once per epoch
        assert _as_multiset(images) == _as_multiset(in_order)


def test_augmentation_only_flips_and_turns_each_image(feature_files):
    index = scan_features(feature_files)
    originals, labels = _stream(make_dataset(feature_files, index, "train", 16))

    augmented, same_labels = _stream(make_dataset(feature_files, index, "train", 16, augment=True, seed=5))

    assert augmented.dtype == np.float32 and np.array_equal(same_labels, labels)
    assert all(any(np.array_equal(a, s) for s in _symmetries(o)) for a, o in zip(augmented, originals))
    assert not np.array_equal(augmented, originals)


def test_rows_that_failed_featurisation_are_skipped(tmp_path):
    rows = training_data.synthetic_raw_rows(40, "b0", seed=1)
    broken = [
        training_data.raw_row("b0", label, f"broken-{label}.png", b"not an image", split="train")
        for label in ("defective", "functional")
    ]
    features = compute_features(pd.concat([rows, pd.DataFrame(broken)]), CONFIG)
    path = tmp_path / "part-00000.parquet"
    pq.write_table(pa.Table.from_pandas(features, preserve_index=False), path)
    files = FeatureFiles(pafs.LocalFileSystem(), (str(path),))
    index = scan_features(files)

    images, labels = _stream(make_dataset(files, index, "train", batch_size=8))

    assert index.failed_rows == 2
    assert len(images) == len(labels) == index.rows("train") == (features.query("split == 'train'").shape[0] - 2)


def _feature_file_with_bad_tensor(feature_files, tmp_path, tensor: bytes | None):
    """A copy of the fixture's first file whose first training row, still marked ok, has ``tensor``."""
    table = pq.read_table(feature_files.paths[0])
    first_train = table["split"].to_pylist().index("train")
    tensors = table["tensor"].to_pylist()
    tensors[first_train] = tensor
    table = table.set_column(table.schema.get_field_index("tensor"), "tensor", pa.array(tensors, pa.binary()))
    path = tmp_path / "part-00000.parquet"
    pq.write_table(table, path)
    return FeatureFiles(feature_files.filesystem, (str(path),) + feature_files.paths[1:])


@pytest.mark.parametrize("tensor, message", [(b"\x00" * 100, "not 1024 bytes .* one of 100 bytes"), (None, "have no tensor")])
def test_a_tensor_of_the_wrong_size_stops_the_epoch_with_what_to_fix(feature_files, tmp_path, tensor, message):
    files = _feature_file_with_bad_tensor(feature_files, tmp_path, tensor)
    index = scan_features(files)

    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{message}.*re-materialize"):
        _stream(make_dataset(files, index, "train", batch_size=8))


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_pixel_block_views_a_sliced_binary_column(binary_type):
    images = np.random.default_rng(0).integers(0, 256, (10, *SHAPE), dtype=np.uint8)
    column = pa.array([image.tobytes() for image in images], binary_type).slice(3, 5)

    block = _pixel_block(column, SHAPE)

    assert block.shape == (5, *SHAPE) and np.array_equal(block, images[3:8])
    with pytest.raises(FeatureDataError, match="not 2048 bytes"):
        _pixel_block(column, (32, 32, 2))


def test_one_hot_targets_are_the_labels_as_class_probabilities(feature_files):
    index = scan_features(feature_files)

    _, labels = _stream(make_dataset(feature_files, index, "train", 16))
    _, one_hot = _stream(make_dataset(feature_files, index, "train", 16, one_hot=True))

    assert one_hot.dtype == np.float32 and one_hot.shape == (len(labels), 2)
    np.testing.assert_array_equal(one_hot, np.eye(2, dtype=np.float32)[labels])


@pytest.mark.parametrize("one_hot", [False, True])
def test_balanced_sampling_draws_the_classes_equally_often(feature_files, one_hot):
    index = scan_features(feature_files)
    defective, functional = index.label_counts("train")
    assert defective / (defective + functional) < 0.42  # the fixture's classes are unbalanced: about 2 in 5 defective

    def draw(seed: int) -> np.ndarray:
        data = make_dataset(feature_files, index, "train", 50, shuffle=True, seed=seed, one_hot=one_hot, balance_classes=True)
        _, targets = _stream(data.repeat().take(40))  # about 2,000 draws (each pass ends on a part batch) of 198 images
        return targets.argmax(axis=1) if one_hot else targets

    drawn = draw(seed=7)
    assert len(drawn) > 1500 and abs(np.mean(drawn == 0) - 0.5) < 0.05
    np.testing.assert_array_equal(drawn, draw(seed=7))  # the same seed draws the same stream


def test_balanced_sampling_balances_labels_not_graded_targets(feature_files, tmp_path):
    index = scan_features(feature_files)
    table = feature_files.dataset().to_table()
    # Grades unrelated to the labels: most targets' argmax is not the row's label.
    grades = np.resize(np.array([0.0, 0.5, 0.5, 1.0], np.float32), table.num_rows)
    path = tmp_path / "graded.parquet"
    pq.write_table(table.append_column("grade", pa.array(grades)), path)
    graded = FeatureFiles(pafs.LocalFileSystem(), (str(path),))
    images, labels = _parquet_rows(graded, index, "train")
    label_of = {image.tobytes(): label for image, label in zip(images, labels)}

    data = make_dataset(graded, index, "train", 50, shuffle=True, seed=3, soft_targets="grade", balance_classes=True)
    drawn, targets = _stream(data.repeat().take(40))

    assert targets.shape[1] == 2 and set(np.unique(targets[:, 0])) <= {0.0, 0.5, 1.0}  # the grades, not the labels
    drawn_labels = np.array([label_of[image.astype(np.uint8).tobytes()] for image in drawn])  # float32 pixels out
    assert len(drawn_labels) > 1500 and abs(np.mean(drawn_labels == 0) - 0.5) < 0.05


def test_soft_targets_stream_the_graded_column_as_class_probabilities(feature_files, tmp_path):
    index = scan_features(feature_files)  # classes (defective, functional): defective is the positive class
    table = feature_files.dataset().to_table()
    grades = np.resize(np.array([0.0, 1 / 3, 2 / 3, 1.0], np.float32), table.num_rows)
    path = tmp_path / "graded.parquet"
    pq.write_table(table.append_column("grade", pa.array(grades)), path)
    graded = FeatureFiles(pafs.LocalFileSystem(), (str(path),))

    _, targets = _stream(make_dataset(graded, index, "validation", 7, soft_targets="grade"))
    expected = grades[np.asarray(table.column("split")) == "validation"][
        np.asarray(table.column("feature_status"))[np.asarray(table.column("split")) == "validation"] == "ok"
    ]
    np.testing.assert_allclose(targets[:, 0], expected, atol=1e-6)  # P(defective)
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, atol=1e-6)

    pq.write_table(table.append_column("grade", pa.array(grades * 2)), path)  # "probabilities" up to 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="'grade' holds values outside \\[0, 1\\]"):
        _stream(make_dataset(graded, index, "validation", 7, soft_targets="grade"))
