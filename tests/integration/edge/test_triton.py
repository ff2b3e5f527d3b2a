"""The Triton model repository: layout, and a config.pbtxt whose names match the SavedModel signature."""

from __future__ import annotations

import re

import numpy as np
import pytest
from support.edge_data import CLASS_NAMES

from dgx_assets.edge.triton import TensorSignature, export_triton_repository, triton_config


def parse_tensors(config_text: str, section: str) -> list[dict]:
    """The name/data_type/dims of each tensor in an `input [...]` or `output [...]` section of config.pbtxt."""
    body = re.search(rf"^{section} \[\n(.*?)\n\]", config_text, re.S | re.M).group(1)
    tensors = []
    for block in re.findall(r"\{(.*?)\}", body, re.S):
        tensors.append(
            {
                "name": re.search(r'name: "([^"]+)"', block).group(1),
                "data_type": re.search(r"data_type: (\w+)", block).group(1),
                "dims": [int(d) for d in re.search(r"dims: \[([^\]]*)\]", block).group(1).replace(",", " ").split()],
            }
        )
    return tensors


def test_config_pbtxt_names_match_the_savedmodel_signature(trained_classifier, test_inputs, tmp_path):
    import tensorflow as tf

    export = export_triton_repository(
        trained_classifier.model, tmp_path / "triton", "defect_classifier", class_names=CLASS_NAMES, max_batch_size=16
    )
    model_dir = tmp_path / "triton" / "defect_classifier"
    savedmodel_dir = model_dir / "1" / "model.savedmodel"
    assert (savedmodel_dir / "saved_model.pb").is_file()
    config_text = (model_dir / "config.pbtxt").read_text()
    assert config_text == export.config_text
    assert 'platform: "tensorflow_savedmodel"' in config_text and "max_batch_size: 16" in config_text
    assert (model_dir / "labels.txt").read_text().split() == CLASS_NAMES

    # Independently of the exporter's own reading: load the SavedModel and compare with the config text.
    signature = tf.saved_model.load(str(savedmodel_dir)).signatures["serving_default"]
    _, input_specs = signature.structured_input_signature
    output_specs = signature.structured_outputs
    inputs, outputs = parse_tensors(config_text, "input"), parse_tensors(config_text, "output")
    assert [t["name"] for t in inputs] == sorted(input_specs)
    assert [t["name"] for t in outputs] == sorted(output_specs)
    for tensor in inputs:
        spec = input_specs[tensor["name"]]
        assert tensor["dims"] == spec.shape.as_list()[1:] and tensor["data_type"] == "TYPE_FP32"
    for tensor in outputs:
        assert tensor["dims"] == [len(CLASS_NAMES)]

    # What Triton would serve predicts what trained_model predicts.
    batch = test_inputs.keras_inputs[:8].astype("float32")
    served = signature(**{inputs[0]["name"]: tf.constant(batch)})[outputs[0]["name"]].numpy()
    np.testing.assert_allclose(served, trained_classifier.model.predict(batch, verbose=0), atol=1e-5)


def test_config_without_batching_keeps_full_shapes_and_rejects_bad_settings():
    pixels = TensorSignature("pixels", "float32", [None, 24, 24, 1])
    probabilities = TensorSignature("output_0", "float32", [None, 2])
    text = triton_config("m", [pixels], [probabilities], max_batch_size=0)
    assert parse_tensors(text, "input")[0]["dims"] == [-1, 24, 24, 1]
    assert "dynamic_batching" not in text
    with pytest.raises(ValueError, match="variable batch dimension"):
        triton_config("m", [TensorSignature("x", "float32", [1, 24, 24, 1])], [probabilities], max_batch_size=8)
    with pytest.raises(ValueError, match="does not take"):
        triton_config("m", [TensorSignature("x", "complex64", [None, 2])], [probabilities], max_batch_size=8)
    with pytest.raises(ValueError, match="max_batch_size"):
        triton_config("m", [pixels], [probabilities], max_batch_size=-1)
