"""Bad or unusual input to the edge build: clear errors, and the device-side decode."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from dgx_assets.edge.build import EdgeBuildError, build_edge_model, most_common_size
from dgx_assets.edge.config import EdgeModelConfig
from dgx_assets.edge.convert import EdgeConversionConfig, decode_to_raw
from dgx_assets.lake.store import Lake


def encoded(array: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode).save(buffer, format="PNG")
    return buffer.getvalue()


def test_device_decode_converts_channels_depth_and_size():
    rgb = np.zeros((40, 60, 3), np.uint8)
    rgb[..., 0] = 200
    grey = decode_to_raw(encoded(rgb, "RGB"), 48, 48, 1)
    assert grey.shape == (48, 48, 1) and grey.dtype == np.uint8
    assert int(grey[24, 24, 0]) == round(200 * 0.299)  # ITU-R 601 luma, as tf.image.rgb_to_grayscale

    sixteen_bit = np.full((48, 48), 257 * 180, np.uint16)
    assert int(decode_to_raw(encoded(sixteen_bit), 48, 48, 1)[0, 0, 0]) == 180
    assert decode_to_raw(encoded(rgb, "RGB"), 40, 60, 3).shape == (40, 60, 3)
    with pytest.raises(ValueError, match="1 \\(grey\\) or 3"):
        decode_to_raw(encoded(rgb, "RGB"), 40, 60, 4)


def test_most_common_size_is_the_raw_size_convention():
    assert most_common_size([300, 300, 64], [300, 300, 48]) == (300, 300)
    with pytest.raises(EdgeBuildError, match="no valid images"):
        most_common_size([], [])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"quantization": "int4"}, r"quantization\n  Input should be 'int8', 'float16', 'float32' or 'dynamic'"),
        ({"resize_method": "lanczos"}, r"resize_method\n  Input should be 'bilinear_antialias'"),
        ({"raw_height": 0}, r"raw_height\n  Input should be greater than 0"),
        ({"input_scale": 0}, r"input_scale\n  Input should be greater than 0"),
    ],
)
def test_bad_conversion_settings_name_the_setting(options, message):
    with pytest.raises(ValueError, match=message):
        EdgeConversionConfig(**{"raw_height": 48, "raw_width": 48, **options})


def test_missing_upstream_data_says_what_to_materialize(tmp_path, trained_classifier):
    lake = Lake(str(tmp_path / "lake"))
    with pytest.raises(EdgeBuildError, match="materialize trained_model first"):
        build_edge_model(lake, EdgeModelConfig())

    base = lake.asset_uri("trained_model")
    lake.write_bytes(f"{base}/model.keras", trained_classifier.path.read_bytes())
    lake.write_bytes(f"{base}/model_info.json", json.dumps({"class_names": ["a", "b"]}).encode())
    with pytest.raises(EdgeBuildError, match="lacks .*mlflow_run_id"):
        build_edge_model(lake, EdgeModelConfig())

    lake.write_bytes(
        f"{base}/model_info.json",
        json.dumps(
            {
                "class_names": ["functional", "defective"],
                "input_shape": [None, 24, 24, 1],
                "mlflow_run_id": "r",
                "registered_model_name": "m",
                "model_version": "1",
            }
        ).encode(),
    )
    with pytest.raises(EdgeBuildError, match="raw_images holds no Parquet files"):
        build_edge_model(lake, EdgeModelConfig())
    with pytest.raises(EdgeBuildError, match="set both raw_height and raw_width"):
        import pyarrow as pa
        from support.lake_tables import commit_rows

        row = {"sha256": ["x"], "batch": ["b"], "split": ["train"], "width": [48], "height": [48], "status": ["valid"]}
        commit_rows(tmp_path / "lake", "raw_images", pa.table(row | {"label": ["functional"], "content": [b""]}), "b")
        build_edge_model(lake, EdgeModelConfig(raw_height=48))
    with pytest.raises(EdgeBuildError, match="materialize image_features first"):
        build_edge_model(lake, EdgeModelConfig())
