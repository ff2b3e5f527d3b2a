"""The format ladder on a real trained classifier: int8 when it passes the gate, else the next format."""

from __future__ import annotations

import numpy as np
import pytest
from support.edge_data import CLASS_NAMES, RAW_SIZE

from dgx_assets.edge.convert import ConversionSettings
from dgx_assets.edge.ladder import EdgeInputs, run_ladder
from dgx_assets.edge.parity import GateSettings
from dgx_assets.station.tflite_metadata import MetadataError, embed_contract, read_contract


def inputs(test_inputs, representative) -> EdgeInputs:
    return EdgeInputs(
        raw_size=(RAW_SIZE, RAW_SIZE),
        representative=representative,
        test_raw=test_inputs.raw_images,
        test_features=test_inputs.keras_inputs,
        test_labels=test_inputs.labels,
    )


def ladder(trained_classifier, edge_inputs, quantization="auto", gate: GateSettings | None = None):
    return run_ladder(
        trained_classifier.model,
        keras_size_bytes=trained_classifier.path.stat().st_size,
        class_names=CLASS_NAMES,
        inputs=edge_inputs,
        conversion=ConversionSettings(quantization=quantization, representative_samples=100),
        gate=gate or GateSettings(),
        latency_images=10,
    )


def underexposed_calibration() -> list[np.ndarray]:
    """Calibration frames from an underexposed camera (uniform grey level 30): int8 ranges fitted to them clip
    every real image, which is how a real int8 conversion goes wrong (here: accuracy 1.0 -> 0.5)."""
    return [np.full((RAW_SIZE, RAW_SIZE, 1), 30, np.uint8)] * 20


def test_int8_ships_when_it_passes_the_gate(trained_classifier, train_raw_images, test_inputs):
    outcome = ladder(trained_classifier, inputs(test_inputs, train_raw_images))
    assert [t.format for t in outcome.trials] == ["int8"] and outcome.shipped.format == "int8"
    assert outcome.shipped.gate.passed and outcome.shipped.spec.quantization == "int8"
    assert outcome.reason.startswith("int8, the first format of the ladder")
    row = outcome.summary()["trials"][0]
    assert row["passed"] and row["size_ratio"] < 0.5 and row["images"] == 100


def test_when_int8_fails_the_gate_float16_ships(trained_classifier, test_inputs):
    outcome = ladder(trained_classifier, inputs(test_inputs, underexposed_calibration()))
    int8, float16 = outcome.trials
    assert (int8.format, float16.format) == ("int8", "float16")
    assert not int8.gate.passed and int8.report.tflite_accuracy < int8.report.keras_accuracy - 0.01
    assert float16.gate.passed and outcome.shipped is float16
    assert float16.report.top1_agreement >= 0.99 and float16.report.size_ratio > int8.report.size_ratio
    assert outcome.reason.startswith("float16, the first format to pass the parity gate: int8 failed it (")
    summary = outcome.summary()
    assert summary["format"] == "float16" and [t["passed"] for t in summary["trials"]] == [False, True]


def test_forced_int8_ships_int8_and_says_it_fails(trained_classifier, test_inputs):
    outcome = ladder(trained_classifier, inputs(test_inputs, underexposed_calibration()), quantization="int8")
    assert [t.format for t in outcome.trials] == ["int8"] and outcome.shipped.format == "int8"
    assert not outcome.shipped.gate.passed
    assert outcome.reason.startswith("int8, forced by `quantization: int8`; it fails the parity gate: edge accuracy")
    assert outcome.summary()["requested"] == "int8"


def test_the_contract_travels_inside_the_tflite_file(trained_classifier, train_raw_images, test_inputs):
    outcome = ladder(trained_classifier, inputs(test_inputs, train_raw_images), quantization="float32")
    plain = outcome.shipped.tflite_model
    with pytest.raises(MetadataError, match="no dgx_edge_contract metadata"):
        read_contract(plain)
    contract = {"format": "float32", "class_names": CLASS_NAMES, "decision": {"threshold": 0.61, "positive_index": 1}}
    embedded = embed_contract(plain, contract)
    assert read_contract(embedded) == contract
    assert read_contract(embed_contract(embedded, {**contract, "format": "x"}))["format"] == "x"  # replaced, not added

    from ai_edge_litert.interpreter import Interpreter

    image = test_inputs.raw_images[:1]
    before = Interpreter(model_content=plain).get_signature_runner("serving_default")(image=image)["probabilities"]
    after = Interpreter(model_content=embedded).get_signature_runner("serving_default")(image=image)["probabilities"]
    np.testing.assert_array_equal(before, after)
    with pytest.raises(MetadataError, match="not a readable TFLite model"):
        read_contract(embedded[: len(embedded) // 3])
