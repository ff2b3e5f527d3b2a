"""Turn the trained Keras classifier into a TFLite model an edge device can feed raw pixels.

The edge contract (what an inspection station does, and all it does):

* decode the image itself, into the model's channel count (1 = grey, 3 = RGB), at the fixed raw size
  recorded with the model (`raw_height` x `raw_width`; by default the size the cameras deliver, i.e. the
  most common size of the ingested images; other sizes are resized on the device first);
* feed one image as a **uint8 tensor `[1, raw_height, raw_width, channels]`** to the signature
  `serving_default`, input `image`;
* read **float32 class probabilities `[1, n_classes]`** from output `probabilities`, classes in
  `class_names` order.

Resizing to the network's input size and normalising happen inside the TFLite model, so a device never
re-implements (and never gets wrong) the training preprocessing. The same contract holds for every
format: `int8` (integer, calibrated on a representative dataset), `float16`, `float32` and `dynamic`
(dynamic-range: int8 weights, float activations); edge/ladder.py picks one (`auto`, the default). The int8
model is full-integer unless `float_layers` names layers to keep in float.

TensorFlow is imported inside functions: the Dagster code location imports this module's callers cheaply.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

# The device side (names, decoding) lives where the edge runtime imports it without TensorFlow or pydantic.
from dgx_assets.station.device import INPUT_NAME, OUTPUT_NAME, SIGNATURE_KEY, decode_to_raw  # noqa: F401

# What a conversion produces; `auto` (ConversionSettings only) is the format ladder of edge/ladder.py.
Quantization = Literal["int8", "float16", "float32", "dynamic"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
AUTO = "auto"
# bilinear_antialias is image_features' resize, as two constant FULLY_CONNECTED layers (TFLite has no such
# kernel); the other two are TFLite's own, cheaper and less faithful (docs/decisions/0002-edge-conversion.md).
ResizeMethod = Literal["bilinear_antialias", "bilinear", "nearest"]
RESIZE_METHODS: tuple[str, ...] = get_args(ResizeMethod)
# The layers with the largest int8 error; kept in float they cost no CPU latency, but helped only some models
# (docs/decisions/0002-edge-conversion.md), so the default stays full-integer and this is a suggestion.
LITE0_FLOAT_STEM = ("stem_", "block00_dw_")
# The ops that carry a network's arithmetic: in an int8 model, any of these on float input ran in float.
_COMPUTE_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL")


class ConversionSettings(BaseModel):
    """How trained_model becomes the edge model, declared once: edge_model's Dagster config subclasses this."""

    model_config = ConfigDict(frozen=True)

    quantization: Literal["auto", Quantization] = Field(
        AUTO,
        description="auto: int8 (full-integer, calibrated), else float16, else float32, the first that passes the parity "
        "gate; or one format forced: int8 (for int8-only NPUs), float16, float32 or dynamic (int8 weights, float activations)",
    )
    resize_method: ResizeMethod = Field(
        "bilinear_antialias", description="bilinear_antialias (as image_features), bilinear or nearest"
    )
    # 1.0 is right because trained_model rescales its 0..255 input itself; 1/255 here is the classic
    # "normalised twice" edge bug the parity gate catches.
    input_scale: float = Field(
        1.0, gt=0, description="Factor on raw pixels before the network; 1.0: trained_model rescales itself"
    )
    representative_samples: int = Field(
        100,
        description="Calibration images for int8, from the representative split. Each passes through every test-time "
        "view the model has; on the demo model 100 gave the same int8 figures as 200 in two thirds of the time",
    )
    float_layers: list[str] = Field(
        [],
        description=f"int8: Keras layers (name prefixes) kept in float, e.g. {list(LITE0_FLOAT_STEM)} for EfficientNet-Lite0's "
        "stem and first depthwise convolution; empty: full-integer (what int8-only accelerators need)",
    )

    @model_validator(mode="after")
    def _int8_is_calibrated(self) -> ConversionSettings:
        if self.quantization in (AUTO, "int8") and self.representative_samples <= 0:
            raise ValueError("int8 quantisation needs representative_samples > 0")
        return self


class EdgeConversionConfig(ConversionSettings):
    """One conversion: the settings, one concrete format, and the raw size the device feeds."""

    # one concrete format: the ladder (edge/ladder.py) chooses it from `auto` first
    quantization: Quantization = Field("int8", description="The one format this conversion makes (not auto)")
    raw_height: int = Field(gt=0)
    raw_width: int = Field(gt=0)


@dataclass(frozen=True)
class EdgeModelSpec:
    """What a device needs to know to call the model; written next to the .tflite as JSON."""

    signature: str
    input_name: str
    input_dtype: str
    input_shape: list[int]
    output_name: str
    output_dtype: str
    output_shape: list[int]
    class_names: list[str]
    quantization: str
    resize_method: str
    model_input_shape: list[int]
    float_layers: list[str]  # int8: the Keras layers whose ops run in float; empty when full-integer

    def to_dict(self) -> dict:
        return asdict(self)


def model_input_shape(model) -> tuple[int, int, int]:
    """(height, width, channels) of a Keras image model, with a clear error for anything else."""
    shape = tuple(model.input_shape)
    if len(shape) != 4 or any(dim is None for dim in shape[1:]):
        raise ValueError(f"trained model input must be [batch, height, width, channels], got {list(shape)}")
    return int(shape[1]), int(shape[2]), int(shape[3])


def resize_matrix(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in] weights of TensorFlow's antialiased bilinear resize along one axis.

    Resizing is linear and separable, so resizing the unit vectors gives its exact matrix; computing it
    with tf.image.resize itself keeps it identical to what image_features does.
    """
    import tensorflow as tf

    unit_columns = tf.eye(size_in)[:, :, tf.newaxis, tf.newaxis]  # batch of [size_in, 1, 1] one-hot images
    resized = tf.image.resize(unit_columns, [size_out, 1], method="bilinear", antialias=True)
    return resized[:, :, 0, 0].numpy().T


def snap_to_int8_grid(matrix: np.ndarray) -> np.ndarray:
    """`matrix` (non-negative, rows summing to 1) moved onto the grid int8 quantisation represents exactly.

    The converter quantises FULLY_CONNECTED weights per output row, symmetric over [-max, max] in 127 steps
    a side; rounding each weight on its own leaves rows summing to about 0.998, a gain error that darkens
    every resized pixel. Here every weight of a row becomes k/D with integer k, the row sums to exactly D/D,
    and its largest weight is 127/D, so the converter's grid (max/127 = 1/D) holds every weight exactly.
    """
    return np.stack([_snap_row(row) for row in matrix]).astype(np.float32)


def _snap_row(row: np.ndarray) -> np.ndarray:
    top = int(np.argmax(row))
    base = 127.0 / float(row[top])
    best = row  # no exact grid nearby: exact weights, small gain error
    for denominator in range(max(1, int(base) - 8), int(base) + 9):
        steps = np.round(row * denominator)
        steps[top] += denominator - steps.sum()  # the largest weight absorbs the rounding: the row sums to 1
        if steps[top] == steps.max() == 127 and steps.min() >= 0:
            snapped = steps / denominator
            if best is row or np.abs(snapped - row).max() < np.abs(best - row).max():
                best = snapped
    return best


def _resize_antialiased(pixels, rows: np.ndarray, columns: np.ndarray):
    """[1, H, W, C] -> [1, height, width, C] given the two `resize_matrix`es.

    Each pass is a FULLY_CONNECTED layer contracting the image's last axis (transposed so the resized axis
    is last): TFLite runs those as one int8 GEMM, several times faster than the BATCH_MATMUL a product with
    the constant on the left becomes, and each pass still accumulates exactly and rounds once.
    """
    import tensorflow as tf

    _, raw_height, raw_width, channels = pixels.shape
    height, width = rows.shape[0], columns.shape[0]
    # Reshapes, not `[0]` / `[tf.newaxis]`: those become STRIDED_SLICE, whose int8 kernel alone takes about
    # 1 ms on a 300x300 image, five times the whole resize.
    planes = tf.transpose(tf.reshape(pixels, [raw_height, raw_width, channels]), [2, 0, 1])  # [C, H, W]
    resized = tf.matmul(tf.reshape(planes, [channels * raw_height, raw_width]), columns, transpose_b=True)
    resized = tf.transpose(tf.reshape(resized, [channels, raw_height, width]), [0, 2, 1])  # [C, width, H]
    resized = tf.matmul(tf.reshape(resized, [channels * width, raw_height]), rows, transpose_b=True)
    resized = tf.transpose(tf.reshape(resized, [channels, width, height]), [2, 1, 0])  # [height, width, C]
    return tf.reshape(resized, [1, height, width, channels])


def _edge_function(model, config: EdgeConversionConfig, input_dtype):
    """The tf.function the device calls: raw pixels in, probabilities out."""
    import tensorflow as tf

    height, width, channels = model_input_shape(model)
    spec = tf.TensorSpec([1, config.raw_height, config.raw_width, channels], input_dtype, name=INPUT_NAME)
    resize = (config.raw_height, config.raw_width) != (height, width)
    if resize and config.resize_method == "bilinear_antialias":
        rows, columns = resize_matrix(config.raw_height, height), resize_matrix(config.raw_width, width)
        if config.quantization in ("int8", "dynamic"):  # int8 weights
            rows, columns = snap_to_int8_grid(rows), snap_to_int8_grid(columns)

    def whole_grey_levels(pixels):
        if input_dtype == tf.float32:
            # In the int8 model this pins the tensor's quantisation to scale 1, zero point 0 over 0..255:
            # its int8 values are exactly the integer grey levels, at no extra cost.
            return tf.quantization.fake_quant_with_min_max_args(pixels, min=0.0, max=255.0, num_bits=8)
        return tf.round(tf.clip_by_value(pixels, 0.0, 255.0))

    @tf.function(input_signature=[spec])
    def edge(image):
        # int8 conversion replaces this float input with uint8; pinned to 0..255 (see above), the uint8
        # input's quantisation is the identity: pixels go in as they are.
        pixels = whole_grey_levels(tf.cast(image, tf.float32))
        if not resize:
            pass
        elif config.resize_method == "bilinear_antialias":
            pixels = _resize_antialiased(pixels, rows, columns)
        else:
            pixels = tf.image.resize(pixels, (height, width), method=config.resize_method)
        if resize and input_dtype != tf.float32:
            # trained_model learnt on whole grey levels (image_features stores uint8), so round here too, but not
            # in int8, where it magnifies the snapped resize weights' error (docs/decisions/0002-edge-conversion.md).
            pixels = whole_grey_levels(pixels)
        if config.input_scale != 1.0:
            pixels = pixels * config.input_scale
        return {OUTPUT_NAME: model(pixels, training=False)}

    return edge


def representative_dataset(raw_images: Iterable[np.ndarray], limit: int) -> Iterator[list[np.ndarray]]:
    """Calibration samples in the edge input domain (raw pixels at raw size), as the converter wants them."""
    for count, image in enumerate(raw_images):
        if count >= limit:
            return
        yield [np.asarray(image, dtype=np.float32)[np.newaxis]]


def convert_to_tflite(
    model,
    config: EdgeConversionConfig,
    representative_images: Sequence[np.ndarray] | None = None,
) -> bytes:
    """Wrap `model` with the edge preprocessing and convert it; returns the .tflite flatbuffer."""
    import keras
    import tensorflow as tf

    if config.quantization == "int8" and not representative_images:
        raise ValueError("int8 quantisation needs representative images from the training split; none were given")
    _, _, channels = model_input_shape(model)
    expected = (config.raw_height, config.raw_width, channels)
    samples = list((representative_images or [])[: config.representative_samples])
    for image in samples:
        if tuple(np.shape(image)) != expected:
            raise ValueError(f"representative image shaped {np.shape(image)}, the edge input is {expected}")
    float_layers = _float_layer_names(model, config.float_layers) if config.quantization == "int8" else []

    # The int8 path starts from a float input the converter turns into uint8; the others take uint8 as is.
    input_dtype = tf.float32 if config.quantization == "int8" else tf.uint8
    edge = _edge_function(model, config, input_dtype)
    with tempfile.TemporaryDirectory(prefix="edge-savedmodel-") as export_dir:
        # Keras 3 variables only freeze into TFLite through a SavedModel that tracks the model.
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(name=SIGNATURE_KEY, fn=edge)
        archive.write_out(export_dir, verbose=False)  # pyright: ignore[reportAttributeAccessIssue]
        converter = tf.lite.TFLiteConverter.from_saved_model(export_dir, signature_keys=[SIGNATURE_KEY])
        converter.optimizations = [] if config.quantization == "float32" else [tf.lite.Optimize.DEFAULT]
        if config.quantization == "int8":
            converter.representative_dataset = lambda: representative_dataset(samples, len(samples))
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.uint8
            converter.inference_output_type = tf.float32
            if float_layers:
                return _quantize_except(converter, float_layers)
        elif config.quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()


def _float_layer_names(model, prefixes: Sequence[str]) -> list[str]:
    """Names of the layers (nested models' included) that start with one of `prefixes`.

    A prefix that matches nothing is an error, not a silently full-integer model: the user asked for float.
    """
    every, stack = [], list(model.layers)
    while stack:
        layer = stack.pop()
        stack.extend(getattr(layer, "layers", []))
        every.append(layer.name)
    unmatched = [prefix for prefix in prefixes if not any(name.startswith(prefix) for name in every)]
    if unmatched:
        raise ValueError(
            f"float_layers {unmatched} match no layer of the trained model; its layers are named like "
            f"{', '.join(sorted(every)[:6])}, …"
        )
    return sorted(name for name in every if name.startswith(tuple(prefixes)))


def _quantize_except(converter, layer_names: Sequence[str]) -> bytes:
    """int8 conversion with the ops of `layer_names` left in float, uint8 input and float output kept.

    The public converter quantises everything; its quantisation debugger can leave ops in float
    (`denylisted_nodes`) but then takes float input, which breaks the edge contract. So this is the
    converter's own two steps, calibrate then quantise, with the denylist passed to the second. It uses
    TensorFlow-internal entry points (those the debugger uses), pinned with tensorflow in constraints.txt;
    describe_tflite checks the result still honours the contract.
    """
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter
    from tensorflow.lite.python import convert as tflite_convert

    converter.experimental_mlir_quantizer = True
    converter._experimental_calibrate_only = True  # the calibrated float model, with each tensor's range
    calibrated = converter.convert()
    # An op stays float when its output tensor is denylisted.
    tensor_names = [detail["name"] for detail in Interpreter(model_content=calibrated).get_tensor_details()]
    # A fused op's tensor name lists every fused layer's op ("…/stem_relu_1/Relu6;…/stem_bn_1/batchnorm/add_1;
    # …/stem_conv_1/convolution"), each under its models' and its layer's scopes: naming any of them keeps the
    # op float.
    wanted = set(layer_names)
    denylist = [name for name in tensor_names if wanted & _scopes(name)]
    if not denylist:
        raise ValueError(f"float_layers matched the layers {sorted(wanted)}, but none of them computes an op of the edge model")
    mlir_quantize: Any = tflite_convert.mlir_quantize  # TF-internal, annotated with a DType class tf.uint8 is not
    return mlir_quantize(
        calibrated,
        disable_per_channel=converter._experimental_disable_per_channel,
        input_data_type=tf.uint8,
        output_data_type=tf.float32,
        denylisted_nodes=denylist,
    )


def _scopes(tensor_name: str) -> set[str]:
    """The scopes of a (fused) TFLite tensor name, Keras's trace numbering removed: the layers and models it is in.

    The last name of each op is the TensorFlow op itself ("add_1", "Relu6"), never a layer, so it is left out.
    """
    return {_untraced(scope) for part in tensor_name.split(";") for scope in part.split("/")[:-1]}


def _layer_of(tensor_name: str) -> str:
    """The Keras layer a TFLite tensor comes from: "model/backbone/stem_relu_1/Relu6;…" -> "stem_relu"
    (a fused op is named after its last layer first)."""
    scope = tensor_name.split(";")[0].rsplit("/", 2)
    return _untraced(scope[-2]) if len(scope) > 1 else scope[0]


def _untraced(scope: str) -> str:
    """A scope without the number Keras appends each time it traces a layer: "stem_relu_1" -> "stem_relu"."""
    return re.sub(r"_\d+$", "", scope)


def describe_tflite(
    tflite_model: bytes, class_names: Sequence[str], config: EdgeConversionConfig, model_input: Sequence[int]
) -> EdgeModelSpec:
    """Read the converted model's real interface and check it honours the edge contract."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=tflite_model)
    signatures = interpreter.get_signature_list()
    if signatures.get(SIGNATURE_KEY) != {"inputs": [INPUT_NAME], "outputs": [OUTPUT_NAME]}:
        raise ValueError(f"converted model signatures {signatures} do not match the edge contract")
    runner = interpreter.get_signature_runner(SIGNATURE_KEY)
    input_detail = runner.get_input_details()[INPUT_NAME]
    output_detail = runner.get_output_details()[OUTPUT_NAME]
    if input_detail["dtype"] != np.uint8:
        raise ValueError(f"edge input must be uint8 pixels, the converted model takes {input_detail['dtype']}")
    scale, zero_point = input_detail["quantization"]
    if config.quantization == "int8" and (scale, zero_point) != (1.0, 0):
        raise ValueError(
            f"int8 input quantisation is scale={scale}, zero_point={zero_point}; raw pixels would need rescaling on the device"
        )
    if len(class_names) != int(output_detail["shape"][-1]):
        raise ValueError(f"{len(class_names)} class names for a model with {output_detail['shape'][-1]} outputs")
    tensors = {detail["index"]: detail for detail in interpreter.get_tensor_details()}
    float_layers = [
        _layer_of(tensors[op["outputs"][0]]["name"])
        for op in interpreter._get_ops_details()
        if config.quantization == "int8" and op["op_name"] in _COMPUTE_OPS and tensors[op["inputs"][0]]["dtype"] == np.float32
    ]
    return EdgeModelSpec(
        signature=SIGNATURE_KEY,
        input_name=INPUT_NAME,
        input_dtype=np.dtype(input_detail["dtype"]).name,
        input_shape=[int(d) for d in input_detail["shape"]],
        output_name=OUTPUT_NAME,
        output_dtype=np.dtype(output_detail["dtype"]).name,
        output_shape=[int(d) for d in output_detail["shape"]],
        class_names=list(class_names),
        quantization=config.quantization,
        resize_method=config.resize_method,
        model_input_shape=[int(d) for d in model_input],
        float_layers=float_layers,
    )
