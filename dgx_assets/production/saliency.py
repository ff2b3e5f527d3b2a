"""Grad-CAM saliency for the review queue: where the classifier looked, as a heatmap over the image.

Grad-CAM (Selvaraju et al. 2017) as the keras.io recipe draws it: the feature map after the backbone's last
convolution, each channel weighted by the mean gradient of the class score over it, summed, clipped at zero,
scaled to [0, 1] and resized to the image. Two choices differ from the recipe:

- A model averaging dihedral views (`model.with_dihedral_views`) is explained through its single view: the
  views' maps, each in its own orientation, would blur into a picture of no one network's attention.
- The class score is the centred logit (the class's logit minus the mean logit), not the softmax output: the
  softmax's gradient vanishes on confident images (P = 1.0, many of the queue's), and softmax logits are only
  defined up to a constant both classes share.

TensorFlow and Keras are imported inside the functions: the Dagster definitions may import this module.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
from PIL import Image

from dgx_assets.training.model import single_view

COLOUR_MAP = "jet"  # keras.io's; matplotlib is a core dependency


class SaliencyError(ValueError):
    """A model Grad-CAM cannot explain, or inputs it cannot draw."""


def grad_cam(model: Any, pixels: np.ndarray, class_index: int) -> np.ndarray:
    """Grad-CAM heatmap of one image (float32 pixels 0..255, (H, W, C) or grey (H, W)) for `class_index`:
    float32 (H, W) in [0, 1], 1 where the class's evidence is strongest (all 0 when there is none)."""
    return grad_cams(model, np.asarray(pixels)[None], [class_index])[0]


def grad_cams(model: Any, batch: np.ndarray, class_indices: int | Sequence[int]) -> np.ndarray:
    """Grad-CAM heatmaps of a batch (n, H, W, C) (grey: or (n, H, W)), one class index per image or one for
    all: float32 (n, H, W) in [0, 1]. One forward and one backward pass for the whole batch."""
    import tensorflow as tf

    single = single_view(model)
    images = _checked_batch(single, batch)
    classes = _checked_classes(single, class_indices, len(images))
    explain = _explainer(single)
    pixels = tf.convert_to_tensor(images)
    with tf.GradientTape() as tape:
        tape.watch(pixels)  # a frozen backbone has no trainable variable the tape would follow
        features, scores = explain(pixels)
        chosen = tf.gather(scores, classes, axis=1, batch_dims=1)
    # Inference mode: the images do not interact, so the gradient of their sum is each image's own.
    gradients = tf.cast(tape.gradient(chosen, features), tf.float32)
    features = tf.cast(features, tf.float32)
    weights = tf.reduce_mean(gradients, axis=(1, 2), keepdims=True)
    cams = tf.nn.relu(tf.reduce_sum(weights * features, axis=-1, keepdims=True))
    cams = tf.image.resize(cams, images.shape[1:3], method="bilinear")[..., 0].numpy()
    peaks = cams.max(axis=(1, 2), keepdims=True)
    return np.clip(np.divide(cams, peaks, out=np.zeros_like(cams), where=peaks > 0), 0.0, 1.0).astype(np.float32)


def last_convolution(model: Any) -> list[Any]:
    """The single view's last 2-D convolution, as the path to it: the nested models it lies in, then the layer.
    Found by layer type, searching nested models (the backbone) from the output back."""
    import keras

    convolutions = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D, keras.layers.Conv2DTranspose)

    def search(owner: Any) -> list[Any] | None:
        for layer in reversed(owner.layers):
            if isinstance(layer, convolutions):
                return [layer]
            if isinstance(layer, keras.Model) and (inner := search(layer)):
                return [layer, *inner]
        return None

    single = single_view(model)
    if (path := search(single)) is None:
        raise SaliencyError(f"model {single.name!r} has no 2-D convolution: Grad-CAM needs a convolutional feature map")
    return path


def overlay_png(pixels: np.ndarray, heatmap: np.ndarray, alpha: float = 0.4) -> bytes:
    """The image (grey (H, W) or (H, W, 1), or RGB (H, W, 3); values 0..255) with the heatmap ((H, W) in
    [0, 1]) coloured by COLOUR_MAP and blended on at `alpha`, as RGB PNG bytes: the same input, the same bytes."""
    image = _rgb(pixels)
    heat = np.asarray(heatmap, dtype=np.float64)
    if heat.shape != image.shape[:2]:
        raise SaliencyError(f"the heatmap is {heat.shape}, the image {image.shape[:2]}: they must be the same (H, W)")
    if not np.isfinite(heat).all():
        raise SaliencyError("the heatmap holds NaN or infinite values")
    if heat.min() < 0.0 or heat.max() > 1.0:
        raise SaliencyError(f"heatmap values must lie in [0, 1], got {heat.min():.3g}..{heat.max():.3g}")
    if not 0.0 <= alpha <= 1.0:
        raise SaliencyError(f"alpha must lie in [0, 1], got {alpha}")
    colours = _colour_table()[np.rint(heat * 255).astype(np.uint8)]
    blended = np.rint((1.0 - alpha) * image + alpha * colours).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(blended, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _explainer(single: Any) -> Callable[[Any], tuple[Any, Any]]:
    """pixels -> (the feature map after the last convolution, centred class scores), as one differentiable call
    through the nested models, reusing the model's layers (no copy of its weights)."""
    import keras

    *nests, convolution = last_convolution(single)
    feature_map = _feature_map(nests[-1] if nests else single, convolution)
    head = single.layers[-1]
    if isinstance(head, keras.layers.Dense) and head.activation is keras.activations.softmax:
        output, to_scores = head.input, _centred_logits(head)
    else:  # no softmax layer to see past: its own output is the score
        output, to_scores = single.outputs[0], lambda scores: scores
    split = _split(single, nests, feature_map, output)

    def explain(pixels: Any) -> tuple[Any, Any]:
        features, last = split(pixels)
        return features, to_scores(last)

    return explain


def _feature_map(owner: Any, convolution: Any) -> Any:
    """The convolution's output after the layers that follow it at its resolution (normalisation, activation,
    a residual sum): the map the head pools, as keras.io takes the activation after the last convolution."""
    import keras

    layers = owner.layers
    chosen, size = convolution, tuple(convolution.output.shape[1:3])
    for layer in layers[layers.index(convolution) + 1 :]:
        shape = getattr(layer.output, "shape", ())
        if isinstance(layer, keras.Model) or len(shape) != 4 or tuple(shape[1:3]) != size:
            break
        chosen = layer
    return chosen.output


def _centred_logits(head: Any) -> Callable[[Any], Any]:
    from keras import ops

    def scores(features: Any) -> Any:
        logits: Any = ops.matmul(ops.cast(features, head.kernel.dtype), head.kernel)  # keras' ops are loosely annotated
        if head.use_bias:
            logits = logits + head.bias
        return logits - ops.mean(logits, axis=-1, keepdims=True)

    return scores


def _split(owner: Any, nests: list[Any], feature_map: Any, output: Any) -> Callable[[Any], tuple[Any, Any]]:
    """inputs of `owner` -> (feature_map, output): `feature_map` lies in the innermost of `nests`, `output` in
    `owner`. Each nested model is cut where `owner` calls it: before the call, the nested model's own split,
    after the call."""
    import keras

    if not nests:
        both = keras.Model(owner.inputs, [feature_map, output])
        return lambda inputs: tuple(both(inputs, training=False))
    nested, rest = nests[0], nests[1:]
    call = _only_call(nested, owner)
    before = keras.Model(owner.inputs, call.input_tensors)
    inner = _split(nested, rest, feature_map, nested.outputs)
    after = keras.Model(call.output_tensors, output)

    def run(inputs: Any) -> tuple[Any, Any]:
        features, nested_outputs = inner(before(inputs, training=False))
        return features, after(nested_outputs, training=False)

    return run


def _only_call(nested: Any, owner: Any) -> Any:
    # Keras has no public API for the tensors a nested model was called on in its owner's graph (a
    # Functional's .input and .output are its own); keras.utils.plot_model and summary read this list too.
    calls = nested._inbound_nodes
    if len(calls) != 1:
        raise SaliencyError(
            f"{nested.name!r} is called {len(calls)} times in {owner.name!r}: Grad-CAM needs the one call whose "
            "feature map the classifier pools"
        )
    return calls[0]


def _checked_batch(single: Any, batch: np.ndarray) -> np.ndarray:
    images = np.asarray(batch, dtype=np.float32)
    expected = tuple(single.input_shape[1:])
    if images.ndim == 3 and expected[-1] == 1:
        images = images[..., None]  # grey images without their channel axis
    if images.ndim != 4 or tuple(images.shape[1:]) != expected or not len(images):
        raise SaliencyError(f"the model takes images {expected} (a batch: (n, *that)), got an array of {np.shape(batch)}")
    if not np.isfinite(images).all():
        raise SaliencyError("the images hold NaN or infinite pixel values")
    return images


def _checked_classes(single: Any, class_indices: int | Sequence[int], count: int) -> np.ndarray:
    classes = np.asarray(class_indices, dtype=np.int64).reshape(-1)
    if classes.size == 1:
        classes = np.repeat(classes, count)  # one class for all the images
    if classes.size != count:
        raise SaliencyError(f"{count} images need {count} class indices (or one for all), got {classes.size}")
    known = int(single.output_shape[-1])
    if ((classes < 0) | (classes >= known)).any():
        raise SaliencyError(f"class indices must lie in 0..{known - 1}, got {sorted(set(classes.tolist()))}")
    return classes


def _rgb(pixels: np.ndarray) -> np.ndarray:
    image = np.asarray(pixels, dtype=np.float64)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    if image.ndim != 3 or image.shape[-1] != 3 or not image.size:
        raise SaliencyError(f"the image must be grey (H, W) or (H, W, 1), or RGB (H, W, 3), got {np.shape(pixels)}")
    if not np.isfinite(image).all():
        raise SaliencyError("the image holds NaN or infinite pixel values")
    return np.clip(image, 0.0, 255.0)


@cache
def _colour_table() -> np.ndarray:
    """COLOUR_MAP as 256 RGB rows of uint8: a heat of h in [0, 1] is row round(255 h)."""
    import matplotlib

    return np.rint(matplotlib.colormaps[COLOUR_MAP](np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.uint8)
