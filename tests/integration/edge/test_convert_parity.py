"""The edge model converted from a real (small) trained classifier, run in ai_edge_litert on real PNGs."""

from __future__ import annotations

import numpy as np
import pytest
from support.edge_data import CLASS_NAMES, MODEL_SIZE, RAW_SIZE
from support.edge_parity import measure_parity

from dgx_assets.edge.convert import (
    LITE0_FLOAT_STEM,
    EdgeConversionConfig,
    _resize_antialiased,
    convert_to_tflite,
    describe_tflite,
    resize_matrix,
    snap_to_int8_grid,
)
from dgx_assets.edge.parity import evaluate_gate, parity_figure
from dgx_assets.edge.promotion import Gate, current_alias_version, promote_if_gates_pass


def convert(trained_classifier, train_raw_images, **options) -> bytes:
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, representative_samples=100, **options)
    return convert_to_tflite(trained_classifier.model, config, train_raw_images)


def parity(trained_classifier, test_inputs, tflite_model, quantization="int8"):
    return measure_parity(
        tflite_model,
        trained_classifier.model,
        raw_images=test_inputs.raw_images,
        keras_inputs=test_inputs.keras_inputs,
        labels=test_inputs.labels,
        keras_size_bytes=trained_classifier.path.stat().st_size,
        quantization=quantization,
        latency_images=50,
    )


@pytest.fixture(scope="session")
def int8_model(trained_classifier, train_raw_images) -> bytes:
    return convert(trained_classifier, train_raw_images)


def test_int8_edge_model_takes_raw_uint8_pixels_and_is_integer_inside(int8_model):
    from ai_edge_litert.interpreter import Interpreter

    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE)
    spec = describe_tflite(int8_model, CLASS_NAMES, config, (MODEL_SIZE, MODEL_SIZE, 1))
    assert (spec.input_dtype, spec.input_shape) == ("uint8", [1, RAW_SIZE, RAW_SIZE, 1])
    assert (spec.output_dtype, spec.output_shape) == ("float32", [1, len(CLASS_NAMES)])

    interpreter = Interpreter(model_content=int8_model)
    interpreter.allocate_tensors()
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    # The antialiased resize (two FULLY_CONNECTED layers) and every layer run on int8 tensors: a full-integer
    # model, not float ops with int8 weights.
    for op in ops:
        if op["op_name"] in ("FULLY_CONNECTED", "CONV_2D"):
            assert tensors[op["inputs"][0]]["dtype"] == np.int8, op
    assert {"FULLY_CONNECTED", "CONV_2D"} <= {op["op_name"] for op in ops}
    # BATCH_MATMUL (a constant times the image) and STRIDED_SLICE cost several times the resize on a CPU.
    assert not {"BATCH_MATMUL", "STRIDED_SLICE"} & {op["op_name"] for op in ops}

    # The resize weights in the model are exactly the snapped ones: nothing was rounded by the converter.
    resize_weights = [
        tensors[op["inputs"][1]]
        for op in ops
        if op["op_name"] == "FULLY_CONNECTED" and tuple(tensors[op["inputs"][1]]["shape"]) == (MODEL_SIZE, RAW_SIZE)
    ]
    assert len(resize_weights) == 2  # rows and columns (the same tensor for a square image)
    weights = resize_weights[0]
    scales = weights["quantization_parameters"]["scales"].reshape(-1, 1)
    np.testing.assert_allclose(
        interpreter.get_tensor(weights["index"]) * scales, snap_to_int8_grid(resize_matrix(RAW_SIZE, MODEL_SIZE)), atol=1e-6
    )


def test_int8_edge_model_agrees_with_keras_on_test_images(trained_classifier, test_inputs, int8_model):
    report, keras, edge = parity(trained_classifier, test_inputs, int8_model)

    assert report.images == len(test_inputs.labels) == 100
    assert report.keras_accuracy >= 0.95, "the fixture classifier did not learn; parity would mean little"
    assert report.top1_agreement >= 0.99, report
    assert abs(report.tflite_accuracy - report.keras_accuracy) <= 0.01
    assert 0 < report.max_probability_difference < 0.1
    assert report.tflite_size_bytes == len(int8_model) < report.keras_size_bytes
    assert report.size_ratio == pytest.approx(len(int8_model) / trained_classifier.path.stat().st_size)
    assert report.latency_images == 50 and report.tflite_latency_ms > 0 and report.keras_latency_ms > 0
    # Same numbers the report claims, recomputed from the predictions.
    assert report.top1_agreement == np.mean(keras.probabilities.argmax(1) == edge.probabilities.argmax(1))
    assert np.allclose(edge.probabilities.sum(axis=1), 1.0, atol=0.02)

    gate = evaluate_gate(report)
    assert gate.passed and not gate.reasons
    assert parity_figure(keras, edge, CLASS_NAMES).startswith(b"\x89PNG")


# Noise is the worst case for the snapped weights (every tap differs from its neighbours): still within
# half a grey level of image_features' resize.
@pytest.mark.parametrize("weights, atol", [(resize_matrix, 1e-3), (lambda *sizes: snap_to_int8_grid(resize_matrix(*sizes)), 0.5)])
@pytest.mark.parametrize("raw_shape, size", [((50, 37, 3), (20, 29)), ((300, 300, 1), (128, 128))])
def test_antialiased_resize_reproduces_tensorflow_resize(weights, atol, raw_shape, size):
    import tensorflow as tf

    pixels = np.random.default_rng(3).uniform(0, 255, (1, *raw_shape)).astype("float32")
    expected = tf.image.resize(pixels, size, method="bilinear", antialias=True).numpy()
    resized = _resize_antialiased(tf.constant(pixels), weights(raw_shape[0], size[0]), weights(raw_shape[1], size[1]))
    np.testing.assert_allclose(resized.numpy(), expected, atol=atol)


@pytest.mark.parametrize("quantization, resize_method", [("float16", "bilinear_antialias"), ("dynamic", "bilinear")])
def test_float16_and_dynamic_range_variants_keep_the_edge_contract(
    trained_classifier, train_raw_images, test_inputs, quantization, resize_method
):
    tflite_model = convert(trained_classifier, train_raw_images, quantization=quantization, resize_method=resize_method)
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, quantization=quantization)
    spec = describe_tflite(tflite_model, CLASS_NAMES, config, (MODEL_SIZE, MODEL_SIZE, 1))
    assert (spec.input_dtype, spec.input_shape) == ("uint8", [1, RAW_SIZE, RAW_SIZE, 1])
    report, _, _ = parity(trained_classifier, test_inputs, tflite_model, quantization)
    assert report.top1_agreement >= 0.99 and evaluate_gate(report).passed


def test_mismatched_preprocessing_fails_the_gate_and_holds_promotion_back(
    trained_classifier, train_raw_images, test_inputs, int8_model, registered_version
):
    # "Normalised twice": the device path divides by 255 although the model rescales itself.
    broken = convert(trained_classifier, train_raw_images, input_scale=1 / 255)
    report, _, _ = parity(trained_classifier, test_inputs, broken)
    gate = evaluate_gate(report)
    assert report.top1_agreement < 0.99
    assert report.disagreements > report.disagreements_near_boundary  # wrong on confident images too
    assert not gate.passed and not gate.criteria[2].passed and gate.criteria[2].value > 0

    outcome = promote_if_gates_pass(
        registered_version.tracking_uri,
        registered_version.model_name,
        registered_version.version,
        [Gate("trained_model", True, "beats baseline"), Gate("edge_parity", gate.passed, "; ".join(gate.reasons))],
        run_id=registered_version.run_id,
    )
    assert not outcome.promoted and "edge_parity" in outcome.reasons[0]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=registered_version.tracking_uri)
    assert current_alias_version(client, registered_version.model_name) is None
    version = client.get_model_version(registered_version.model_name, registered_version.version)
    assert version.tags["dgx.promotion"] == "held back"
    assert "trained_model decides with a margin of at least" in version.tags["dgx.gate.edge_parity"]
    assert client.get_run(registered_version.run_id).data.tags["dgx.promotion"] == "held back"

    # The correctly converted model passes the same gate, and then the version becomes champion.
    good_report, _, _ = parity(trained_classifier, test_inputs, int8_model)
    good_gate = evaluate_gate(good_report)
    outcome = promote_if_gates_pass(
        registered_version.tracking_uri,
        registered_version.model_name,
        registered_version.version,
        [Gate("trained_model", True), Gate("edge_parity", good_gate.passed)],
        run_id=registered_version.run_id,
    )
    assert outcome.promoted
    assert current_alias_version(client, registered_version.model_name) == registered_version.version


@pytest.mark.parametrize("size_in, size_out", [(300, 128), (48, 24), (37, 29), (128, 300)])
def test_int8_resize_weights_sit_exactly_on_the_int8_grid(size_in, size_out):
    exact = resize_matrix(size_in, size_out)
    snapped = snap_to_int8_grid(exact)
    np.testing.assert_allclose(snapped.sum(axis=1), 1.0, atol=1e-6)  # no gain error
    steps = snapped * (127.0 / snapped.max(axis=1, keepdims=True))  # the converter's grid: row max / 127
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
    assert np.abs(snapped - exact).max() < 0.005


@pytest.mark.parametrize("quantization", ["int8", "float16", "dynamic"])
def test_edge_preprocessing_reproduces_image_features_tensors(edge_dataset, train_raw_images, quantization):
    """A pass-through network exposes what the edge model feeds the classifier: image_features' tensors."""
    import keras
    from ai_edge_litert.interpreter import Interpreter
    from support.edge_data import edge_inputs

    pixels = keras.Input((MODEL_SIZE, MODEL_SIZE, 1))
    passthrough = keras.Model(pixels, keras.layers.Rescaling(1.0)(keras.layers.Flatten()(pixels)))
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, quantization=quantization)
    runner = Interpreter(model_content=convert_to_tflite(passthrough, config, train_raw_images[:50])).get_signature_runner(
        "serving_default"
    )
    test = edge_inputs(edge_dataset, "test")
    edge = np.stack([runner(image=image[np.newaxis])["probabilities"][0] for image in test.raw_images[:40]])
    difference = edge - test.keras_inputs[:40].reshape(40, -1)
    assert abs(difference.mean()) < 0.1  # unbiased
    assert np.abs(difference).max() <= (3.0 if quantization == "int8" else 1.0)
    assert np.mean(np.abs(difference) <= 1.0) > (0.99 if quantization == "int8" else 1 - 1e-9)


def _stem_classifier():
    """A small network with EfficientNet-Lite0's stem and block-0 layer names, for the float_layers tests."""
    import keras

    keras.utils.set_random_seed(1)
    pixels = keras.Input((MODEL_SIZE, MODEL_SIZE, 1), name="pixels")
    x = keras.layers.Rescaling(1 / 128, offset=-127 / 128, name="rescale")(pixels)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(x)
    batch_norm = keras.layers.BatchNormalization(name="stem_bn")
    x = batch_norm(x)
    # Trained statistics, as in a real stem: an identity batch normalisation folds away without a trace.
    rng = np.random.default_rng(1)
    batch_norm.set_weights([rng.uniform(0.5, 2.0, 8), rng.normal(0, 0.1, 8), rng.normal(0, 0.1, 8), rng.uniform(0.5, 2.0, 8)])
    x = keras.layers.ReLU(6.0, name="stem_relu")(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="block00_dw_conv")(x)
    x = keras.layers.ReLU(6.0, name="block00_dw_relu")(x)
    x = keras.layers.Conv2D(8, 1, name="block00_project_conv")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2, name="dropout")(x)  # no op at inference
    return keras.Model(pixels, keras.layers.Dense(len(CLASS_NAMES), activation="softmax", name="probabilities")(x))


@pytest.mark.parametrize(
    "float_layers, expected",
    [
        (None, []),  # the default: full-integer
        (list(LITE0_FLOAT_STEM), ["stem_relu", "block00_dw_relu"]),  # Lite0's stem and first depthwise convolution
        (["block00_project"], ["block00_project_conv"]),
        (["stem_conv"], ["stem_relu"]),  # the conv is fused with its ReLU into one op: that op stays float
        (["stem_bn"], ["stem_relu"]),  # so is the batch normalisation
    ],
)
def test_float_layers_stay_float_and_the_edge_contract_holds(train_raw_images, float_layers, expected):
    from ai_edge_litert.interpreter import Interpreter

    options = {} if float_layers is None else {"float_layers": float_layers}
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, representative_samples=50, **options)
    tflite_model = convert_to_tflite(_stem_classifier(), config, train_raw_images)
    spec = describe_tflite(tflite_model, CLASS_NAMES, config, (MODEL_SIZE, MODEL_SIZE, 1))

    # Still raw uint8 pixels in (scale 1, zero point 0: describe_tflite checks it), probabilities out.
    assert (spec.input_dtype, spec.output_dtype) == ("uint8", "float32")
    assert spec.float_layers == expected
    # Every other compute op, the resize's two FULLY_CONNECTED included, is int8.
    interpreter = Interpreter(model_content=tflite_model)
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    integer_ops = [op for op in interpreter._get_ops_details() if tensors[op["inputs"][0]]["dtype"] == np.int8]
    assert sum(op["op_name"] == "FULLY_CONNECTED" for op in integer_ops) >= 2
    assert sum(op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D") for op in integer_ops) == 3 - len(expected)


@pytest.mark.parametrize(
    "float_layers, error",
    [
        (["stem_", "block07_"], r"float_layers \['block07_'\] match no layer of the trained model; its layers are named like"),
        (["dropout"], r"matched the layers \['dropout'\], but none of them computes an op"),
    ],
)
def test_float_layers_that_keep_nothing_in_float_are_refused(train_raw_images, float_layers, error):
    # Asked for float and silently given full-integer, a user would measure the wrong model.
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, representative_samples=50, float_layers=float_layers)
    with pytest.raises(ValueError, match=error):
        convert_to_tflite(_stem_classifier(), config, train_raw_images)
