"""Keras classifier with a configurable backbone.

The saved model takes float32 pixel values 0..255 of shape (H, W, C) and does its own rescaling, so the
edge model and any caller feed raw pixels. Only standard Keras layers and ops are used: the ``.keras``
file loads with plain ``keras.models.load_model`` and converts to TFLite without our code installed.

The default backbone is ImageNet EfficientNet-Lite0 (``dgx_assets.backbones``; EfficientNet-Lite2 is the
larger choice), fine-tuned from block ``trainable_from_block`` up, batch normalisation included; the blocks
below it stay frozen.
"""

from __future__ import annotations

import os
from typing import Any

from dgx_assets.backbones import efficientnet_lite
from dgx_assets.backbones.checkpoint import read_state_dict
from dgx_assets.training.config import BACKBONES, SCRATCH, ModelConfig, ModelConfigError
from dgx_assets.training.decision import DIHEDRAL, VIEW_GROUPS, turns_a_quarter

# The classifier's named layers other code relies on: the input, the pooled features (the embedding
# the feature job can reuse) and the softmax output.
INPUT_NAME = "pixels"
EMBEDDING_LAYER = "embedding"
OUTPUT_NAME = "probabilities"

# Faster-moving batch-norm statistics than Keras' 0.99: small datasets give only a few hundred steps, and
# with slow statistics the first epochs validate on nearly uninitialised moving means.
_BN_MOMENTUM = 0.9

# ImageNet channel means (BGR) of the Caffe-style preprocessing ResNet50 weights expect.
_CAFFE_BGR_MEAN = (103.939, 116.779, 123.68)


def build_backbone(config: ModelConfig, input_shape: tuple[int, int, int]) -> Any:
    """The feature extractor alone: a Keras model from preprocessed pixels to a feature map."""
    import keras

    if config.backbone == SCRATCH:
        backbone = _mobilenet_small(input_shape, config.width)
        if config.weights_path:
            backbone.load_weights(config.weights_path)
        return backbone
    variant = config.lite_variant
    if variant is not None:
        return _fine_tunable_lite(config, variant, input_shape)
    application = {
        "mobilenet_v2": keras.applications.MobileNetV2,
        "resnet50": keras.applications.ResNet50,
    }[config.backbone]
    # Keras applications take a weights file path directly; "imagenet" would need the internet.
    return application(include_top=False, weights=config.weights_path, input_shape=input_shape)


def build_classifier(config: ModelConfig, input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """Uncompiled classifier: float32 pixels 0..255 in, softmax over ``num_classes`` out."""
    import keras

    if num_classes < 2:
        raise ModelConfigError(f"need at least two classes to train a classifier, got {num_classes}")
    height, width, channels = input_shape
    if channels not in (1, 3):
        raise ModelConfigError(f"input channels must be 1 or 3, got {channels} (setting 'channels')")
    needs_rgb = BACKBONES[config.backbone][0]

    pixels = keras.Input(shape=input_shape, dtype="float32", name=INPUT_NAME)
    x = pixels
    if needs_rgb and channels == 1:
        # Pretrained application weights expect three channels: repeat the grey plane.
        x = keras.layers.Concatenate(name="grey_to_rgb")([x, x, x])
    x = _preprocessing(config.backbone, x)
    backbone = build_backbone(config, (height, width, 3 if needs_rgb else channels))
    x = backbone(x)
    x = keras.layers.GlobalAveragePooling2D(name=EMBEDDING_LAYER)(x)
    if config.dropout:
        x = keras.layers.Dropout(config.dropout, name="dropout")(x)
    # float32 output even under mixed precision: softmax in float16 loses the small probabilities.
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name=OUTPUT_NAME)(x)
    return keras.Model(pixels, outputs, name=f"defect_classifier_{config.backbone}")


VIEWS_SUFFIX = "_dihedral_views"


def with_dihedral_views(classifier: Any, views: int) -> Any:
    """The classifier deciding on the mean of its probabilities over `views` views of each image (the group
    `decision.VIEW_GROUPS` names): test-time augmentation inside the graph, so the saved model, the edge model
    and Triton all do it (at `views` times the inference cost). Flips, transposes and an Average layer: plain
    Keras, plain TFLite ops."""
    import keras

    if views == 1:
        return classifier
    height, width, _ = classifier.input_shape[1:]
    if turns_a_quarter(views) and height != width:
        raise ModelConfigError(
            f"{views} views turn the image a quarter: they need square inputs, got {height}x{width} "
            "(settings 'test_time_views', 'image_height')"
        )
    pixels = keras.Input(classifier.input_shape[1:], name=INPUT_NAME)

    def view(turns: int, mirrored: bool):
        image = keras.ops.flip(pixels, axis=2) if mirrored else pixels
        for _ in range(turns):  # counterclockwise, as numpy's rot90: the transpose, flipped upside down
            image = keras.ops.flip(keras.ops.transpose(image, (0, 2, 1, 3)), axis=1)
        return image

    outputs = [classifier(view(*DIHEDRAL[index])) for index in VIEW_GROUPS[views]]
    return keras.Model(pixels, keras.layers.Average(name=OUTPUT_NAME)(outputs), name=classifier.name + VIEWS_SUFFIX)


def single_view(model: Any) -> Any:
    """The classifier inside a `with_dihedral_views` model (the model itself otherwise)."""
    if not model.name.endswith(VIEWS_SUFFIX):
        return model
    return model.get_layer(model.name.removesuffix(VIEWS_SUFFIX))


def embedding_model(classifier: Any) -> Any:
    """The classifier cut at its pooled features."""
    import keras

    classifier = single_view(classifier)  # a saved classifier may average the dihedral views
    return keras.Model(classifier.inputs, classifier.get_layer(EMBEDDING_LAYER).output)


def model_from_bytes(data: bytes, compile: bool = True) -> Any:
    """A `.keras` file's bytes as a model (what travels between processes: Spark tasks, broadcasts, MLflow)."""
    import tempfile

    import keras

    with tempfile.TemporaryDirectory(prefix="dgx-model-") as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as out:
            out.write(data)
        return keras.models.load_model(path, compile=compile)


def load_embedding_model(source: str, input_shape: tuple[int, int, int]) -> Any:
    """An embedding model: ``efficientnet_lite0`` or ``efficientnet_lite2`` (the packaged ImageNet weights), a
    saved classifier (``.keras``, cut at its pooled features) or an EfficientNet-Lite weights file (``.pth``).
    Each is a classifier's own pooled features, so `train.warm_start_head` can fit a head on them."""
    import keras

    if source in efficientnet_lite.VARIANTS:
        config = ModelConfig.model_validate({"backbone": source, "dropout": 0.0})
        return embedding_model(build_classifier(config, input_shape, num_classes=2))
    if not os.path.isfile(source):
        raise ModelConfigError(
            f"embedding model file {source!r} (setting 'embedding') does not exist: give "
            f"{', '.join(efficientnet_lite.VARIANTS)}, none, or a local .keras or .pth file present on every executor"
        )
    if source.endswith(".keras"):
        model: Any = keras.models.load_model(source, compile=False)  # keras' loader is unannotated; a Model here
        if tuple(model.input_shape[1:]) != tuple(input_shape):
            raise ModelConfigError(
                f"embedding model {source!r} takes input {tuple(model.input_shape[1:])}, but the "
                f"features are {tuple(input_shape)}: match image_size/channels to the model"
            )
        return embedding_model(model)
    # A .pth says which variant it is by its block count; loading it checks every tensor's shape.
    variant = efficientnet_lite.checkpoint_variant(read_state_dict(source))
    if variant is None:
        raise ModelConfigError(
            f"embedding weights {source!r} (setting 'embedding') are not an EfficientNet-Lite state dict of "
            f"{' or '.join(f'{v.blocks} blocks ({v.name})' for v in efficientnet_lite.VARIANTS.values())}"
        )
    config = ModelConfig.model_validate({"backbone": variant.name, "weights_path": source, "dropout": 0.0})
    return embedding_model(build_classifier(config, input_shape, num_classes=2))


def _preprocessing(backbone: str, x: Any) -> Any:
    import keras

    if backbone == "resnet50":
        # Caffe-style: RGB -> BGR, then subtract the ImageNet means, on the 0..255 scale.
        x = keras.ops.flip(x, axis=-1)
        return keras.layers.Normalization(mean=list(_CAFFE_BGR_MEAN), variance=[1.0, 1.0, 1.0], name="caffe_preprocessing")(x)
    if backbone in efficientnet_lite.VARIANTS:
        mean, std = efficientnet_lite.INPUT_MEAN, efficientnet_lite.INPUT_STD
        return keras.layers.Rescaling(1.0 / std, offset=-mean / std, name="rescale")(x)
    # MobileNets: scale 0..255 to -1..1.
    return keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescale")(x)


def _fine_tunable_lite(config: ModelConfig, variant: efficientnet_lite.LiteVariant, input_shape: tuple[int, int, int]) -> Any:
    """The pretrained Lite variant (feature map out) with the blocks below ``trainable_from_block`` frozen.

    A frozen BatchNormalization runs in inference mode in Keras 3. Keras' transfer-learning recipe freezes
    all of them; here the fine-tuned blocks' (``fine_tune_batch_norm``) learn the EL images' statistics,
    which are far from ImageNet's: on the demo's ELPV split the best validation loss went from 0.290 (frozen,
    6 epochs) to 0.264 (learning, 5 epochs); test accuracy 87.7 % -> 88.2 %, AUC 0.926 -> 0.945.
    """
    backbone = efficientnet_lite.pretrained_lite(variant, config.pretrained_weights(), input_shape)
    first_trainable = efficientnet_lite.block_name(config.trainable_from_block)
    trainable = False
    for layer in backbone.layers:
        trainable = trainable or layer.name.startswith((first_trainable, "head_"))
        batch_norm = type(layer).__name__ == "BatchNormalization"
        layer.trainable = trainable and (config.fine_tune_batch_norm or not batch_norm)
        if batch_norm and layer.trainable:
            # With Keras' 0.99 the moving statistics inference uses were still mostly ImageNet's after the
            # first epoch (validation loss 0.71 against 0.33 with 0.9 on ELPV), and a small dataset never
            # gets enough steps to leave them.
            layer.momentum = _BN_MOMENTUM
    return backbone


def _mobilenet_small(input_shape: tuple[int, int, int], width: int) -> Any:
    """Depthwise-separable blocks as in MobileNet v1, five stride-2 stages: ~160k parameters at width 48."""
    import keras

    layers = keras.layers
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(width // 2, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = layers.BatchNormalization(momentum=_BN_MOMENTUM, name="stem_bn")(x)
    x = layers.ReLU(6.0, name="stem_relu")(x)
    stages = [(width, 2), (width * 2, 2), (width * 2, 1), (width * 4, 2), (width * 4, 1), (width * 8, 2)]
    for index, (filters, stride) in enumerate(stages, start=1):
        x = layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False, name=f"b{index}_dw")(x)
        x = layers.BatchNormalization(momentum=_BN_MOMENTUM, name=f"b{index}_dw_bn")(x)
        x = layers.ReLU(6.0, name=f"b{index}_dw_relu")(x)
        x = layers.Conv2D(filters, 1, use_bias=False, name=f"b{index}_pw")(x)
        x = layers.BatchNormalization(momentum=_BN_MOMENTUM, name=f"b{index}_pw_bn")(x)
        x = layers.ReLU(6.0, name=f"b{index}_pw_relu")(x)
    return keras.Model(inputs, x, name="mobilenet_small")
