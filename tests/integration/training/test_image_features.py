"""image_features: decoding, channel conversion, resizing and statistics, plain and on Spark."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from imagefactory import valid_images
from PIL import Image
from support import training_data

from dgx_assets.training.config import FeatureConfig
from dgx_assets.training.features import FEATURE_COLUMNS, build_image_features, compute_features, plan_row_groups, tensor_from_row


def _rows_for(images: dict[str, bytes], batch="b1") -> pd.DataFrame:
    return pd.DataFrame([training_data.raw_row(batch, "functional", name, data) for name, data in images.items()])


@pytest.mark.parametrize("channels", [1, 3])
def test_every_accepted_image_form_becomes_a_model_input_tensor(channels):
    forms = valid_images()  # PNG grey/RGBA/palette/16-bit, JPEG RGB/CMYK, BMP, TIFF RGB/16-bit
    config = FeatureConfig(image_height=24, image_width=32, channels=channels)

    features = compute_features(_rows_for(forms), config)

    assert list(features.columns) == FEATURE_COLUMNS
    assert (features["feature_status"] == "ok").all(), features[["path", "feature_error"]]
    for row in features.itertuples():
        tensor = tensor_from_row(row.tensor, row.tensor_shape)
        assert tensor.shape == (24, 32, channels) and tensor.dtype == np.uint8
        assert 0 < tensor.mean() < 255
    assert set(features["feature_device"]) == {"cpu"}


def test_tensor_is_the_resized_image_and_statistics_describe_it():
    grey = np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (64, 1))
    flat = np.full((64, 64), 128, np.uint8)
    checker = (((np.indices((64, 64)) // 8).sum(axis=0) % 2) * 255).astype(np.uint8)
    rows = _rows_for(
        {"ramp.png": training_data.png(grey), "flat.png": training_data.png(flat), "checker.png": training_data.png(checker)}
    )

    features = compute_features(rows, FeatureConfig(image_height=32, image_width=32, channels=1)).set_index("path")
    names = ("ramp.png", "flat.png", "checker.png")
    ramp, flat_row, checker_row = (features.loc[f"file:///landing/b1/functional/{n}"] for n in names)

    resized = np.asarray(Image.fromarray(grey).resize((32, 32), Image.BILINEAR), dtype=np.float64)
    assert np.abs(tensor_from_row(ramp.tensor, ramp.tensor_shape)[..., 0] - resized).mean() < 3.0
    assert flat_row.brightness == pytest.approx(128 / 255, abs=1e-3)
    assert flat_row.contrast == pytest.approx(0.0, abs=1e-6) and flat_row.sharpness == pytest.approx(0.0, abs=1e-6)
    assert checker_row.contrast > 0.4 and checker_row.sharpness > ramp.sharpness > 0


def test_unreadable_valid_row_is_kept_with_its_reason():
    rows = _rows_for({"fine.png": training_data.png(np.zeros((8, 8), np.uint8)), "garbage.png": b"not an image"})

    features = compute_features(rows, FeatureConfig(image_height=16, image_width=16)).set_index("path")

    bad = features.loc["file:///landing/b1/functional/garbage.png"]
    assert bad.feature_status == "error" and bad.tensor is None and bad.feature_error
    assert features.loc["file:///landing/b1/functional/fine.png"].feature_status == "ok"


def test_embedding_comes_from_the_configured_model(tmp_path):
    import keras

    from dgx_assets.training.config import ModelConfig
    from dgx_assets.training.model import build_classifier, embedding_model

    classifier = build_classifier(ModelConfig(backbone="scratch", width=8), (32, 32, 1), num_classes=2)
    saved = tmp_path / "classifier.keras"
    classifier.save(saved)
    rows = _rows_for({"a.png": training_data.png(np.eye(40, dtype=np.uint8) * 255)})
    config = FeatureConfig(image_height=32, image_width=32, embedding=str(saved))

    features = compute_features(rows, config)

    tensor = tensor_from_row(features.tensor[0], features.tensor_shape[0])[None].astype("float32")
    expected = embedding_model(keras.models.load_model(saved)).predict(tensor, verbose=0)[0]
    assert np.allclose(features.embedding[0], expected, atol=1e-5)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "I;16"])
def test_default_embedding_is_imagenet_lite0_on_grey_repeated_to_rgb(mode):
    """Any mode and size in; the embedding is the pretrained backbone's pooled features of the model-input
    tensor, the grey plane repeated to the three channels ImageNet weights expect."""
    import io

    from PIL import Image

    from dgx_assets.backbones import efficientnet_lite

    rng = np.random.default_rng(3)
    grey = rng.integers(0, 256, (45, 61), dtype=np.uint8)
    image = Image.fromarray(grey).convert(mode) if mode != "I;16" else Image.fromarray(grey.astype(np.uint16) * 257)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    rows = _rows_for({"a.png": buffer.getvalue()})

    features = compute_features(rows, FeatureConfig(image_height=64, image_width=48))

    assert features.feature_status[0] == "ok" and len(features.embedding[0]) == efficientnet_lite.EMBEDDING_SIZE
    tensor = tensor_from_row(features.tensor[0], features.tensor_shape[0]).astype("float32")
    rgb = (np.repeat(tensor, 3, axis=-1)[None] - efficientnet_lite.INPUT_MEAN) / efficientnet_lite.INPUT_STD
    backbone = efficientnet_lite.pretrained_lite0(efficientnet_lite.packaged_weights(), (64, 48, 3))
    expected = np.asarray(backbone(rgb, training=False)).mean(axis=(1, 2))[0]
    np.testing.assert_allclose(features.embedding[0], expected, rtol=1e-4, atol=1e-4)


def test_bad_feature_settings_name_the_setting():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="channels"):
        FeatureConfig(channels=2)
    with pytest.raises(ValidationError, match="image_width"):
        FeatureConfig(image_width=4)
    from dgx_assets.training.config import ModelConfigError

    rows = _rows_for({"a.png": training_data.png(np.zeros((8, 8), np.uint8))})
    with pytest.raises(ModelConfigError, match="'embedding'"):
        compute_features(rows, FeatureConfig(embedding="/nowhere/model.keras"))


def test_spark_job_writes_one_feature_row_per_valid_raw_row(spark, elpv_sample, tmp_path):
    invalid = pd.DataFrame(
        [
            training_data.raw_row("elpv-sample", "defective", "broken.png", b"\x89PNG broken", status="corrupted"),
            training_data.raw_row("elpv-sample", "functional", "empty.png", b"", status="empty"),
        ]
    )
    raw = training_data.commit_raw_batch(pd.concat([elpv_sample, invalid]), tmp_path / "lake", "elpv-sample")
    output = tmp_path / "image_features"
    config = FeatureConfig(image_height=64, image_width=64, channels=1, batch_rows=16)

    summary, files = build_image_features(spark, raw, output.as_uri(), config)

    assert summary.valid_rows == summary.feature_rows == len(elpv_sample) == 40
    assert summary.failed_rows == 0 and summary.devices == ["cpu"] and summary.tensor_shape == [64, 64, 1]
    assert files and all(uri.startswith(output.as_uri()) for uri in files)
    written = pq.read_table(output).to_pandas()
    assert set(written["batch"]) == {"elpv-sample"}  # the partition column, stored in the files
    assert len(written) == 40 and set(written["sha256"]) == set(elpv_sample["sha256"])
    by_sha = elpv_sample.set_index("sha256")
    for row in written.itertuples():
        tensor = tensor_from_row(row.tensor, row.tensor_shape)
        assert tensor.shape == (64, 64, 1) and tensor.dtype == np.uint8 and tensor.max() > tensor.min()
        source = by_sha.loc[row.sha256]
        assert (row.label, row.split) == (source.label, source.split)
        original = np.asarray(Image.open(io.BytesIO(source.content)), dtype=np.float64) / 255.0
        assert row.brightness == pytest.approx(original.mean(), abs=0.02)
    # Same values as the plain-Python path: the Spark wrapper adds placement, nothing else.
    plain = compute_features(elpv_sample.head(3), config).set_index("sha256")
    for row in written[written["sha256"].isin(plain.index)].itertuples():
        assert row.tensor == plain.loc[row.sha256].tensor


def test_spark_job_reads_raw_row_groups_in_its_tasks_and_counts_in_the_same_job(spark, tmp_path):
    """One job, one stage: the tasks read their raw row groups themselves (no Spark scan of the image
    bytes, no shuffle, no separate counting job)."""
    rows = pd.concat(
        [
            training_data.synthetic_raw_rows(40, "b0"),
            pd.DataFrame([training_data.raw_row("b0", "defective", "garbage.png", b"not an image")]),  # "valid" to ingest
        ]
    )
    # ingest writes about one file per task slot
    raw = training_data.commit_raw_batch([rows.iloc[index::4] for index in range(4)], tmp_path / "lake", "b0")
    context, group = spark.sparkContext, f"image-features-{tmp_path.name}"
    context.setJobGroup(group, "build_image_features")
    try:
        summary, _ = build_image_features(
            spark, raw, (tmp_path / "features").as_uri(), FeatureConfig(image_height=32, image_width=32, batch_rows=8)
        )
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)

    assert (summary.valid_rows, summary.feature_rows, summary.failed_rows, summary.devices) == (41, 41, 1, ["cpu"])
    written = pq.read_table(tmp_path / "features").to_pandas()
    assert written["feature_status"].value_counts().to_dict() == {"ok": 40, "error": 1}
    tracker = context.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    stages = [tracker.getStageInfo(stage) for job in jobs for stage in tracker.getJobInfo(job).stageIds]
    # local[2]: twice the slots, one row group (file) each; the writer runs in the same stage.
    assert len(jobs) == 1 and [stage.numTasks for stage in stages] == [4]


def test_plan_counts_valid_rows_per_row_group_and_skips_groups_without_any(tmp_path):
    rows = training_data.synthetic_raw_rows(12, "b0")
    rows["status"] = ["valid"] * 5 + ["corrupted"] * 7
    raw = training_data.commit_raw_batch(rows, tmp_path / "lake", "b0", row_group_size=4)
    stray = tmp_path / "lake" / "warehouse" / "dgx" / "raw_images" / "data" / "batch=b0" / "killed-run"
    stray.mkdir(parents=True)
    pq.write_table(training_data.raw_table(rows), stray / "part-00000.parquet")  # never committed: not in the table

    groups = plan_row_groups(raw)
    assert [(group.index, group.valid_rows) for group in groups] == [(0, 4), (1, 1)]  # the third group: none valid
    assert {group.uri for group in groups} == set(raw.uris) and len(raw.uris) == 1


def test_a_raw_partition_without_the_needed_columns_is_refused_with_what_to_do(spark, tmp_path):
    from support.lake_tables import commit_rows

    from dgx_assets.lake.store import Lake

    commit_rows(tmp_path / "lake", "raw_images", pa.table({"path": ["a.png"], "batch": ["b0"], "status": ["valid"]}), "b0")
    raw = Lake(str(tmp_path / "lake")).tables.snapshot("raw_images", batch="b0")
    with pytest.raises(ValueError, match=r"lacks columns .*'content'.*re-materialize raw_images"):
        build_image_features(spark, raw, (tmp_path / "features").as_uri(), FeatureConfig())


def test_a_raw_partition_without_valid_rows_runs_no_spark_job(spark, tmp_path):
    rows = training_data.synthetic_raw_rows(3, "b0").assign(status="corrupted")
    raw = training_data.commit_raw_batch(rows, tmp_path / "lake", "b0")
    summary, _ = build_image_features(spark, raw, (tmp_path / "features").as_uri(), FeatureConfig())
    assert (summary.valid_rows, summary.feature_rows) == (0, 0) and not (tmp_path / "features").exists()
