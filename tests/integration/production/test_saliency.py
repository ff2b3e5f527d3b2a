"""Grad-CAM on a real fine-tuned classifier: the map follows the weights (Adebayo et al. 2018's model
randomisation check) and, on defective ELPV cells, lies on the cell rather than on its dark frame.

One EfficientNet-Lite0 classifier, built as training builds it, fine-tuned for three epochs on 300 real ELPV
cells (about 20 s on two cores), saved and loaded as `.keras` with four dihedral views, as the review queue
gets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from scipy.stats import rankdata

from dgx_assets.production.saliency import SaliencyError, grad_cam, grad_cams, last_convolution
from dgx_assets.training.config import ModelConfig
from dgx_assets.training.decision import POSITIVE_CLASS
from dgx_assets.training.model import build_classifier, single_view, with_dihedral_views

CLASS_NAMES = ["functional", "defective"]
DEFECTIVE = CLASS_NAMES.index(POSITIVE_CLASS)
SIZE = 160  # ELPV's 300 px cells at the model's input: a 5x5 last feature map, half the cost of 224
FRAME = 0.08  # the outer 8 % of each side (24 px of 300): the dark gap and busbar ends around every cell
TRAIN_PER_CLASS = 150
CONFIDENT = 0.9  # P(defective) of the held-out cells explained: a map explains a decision the model made
MAPS = 16


@dataclass
class FineTuned:
    model: Any  # loaded from .keras: four dihedral views around the single-view classifier
    in_memory: Any  # the single-view classifier as trained
    cells: np.ndarray  # held-out cells of defect probability 1.0 the model calls defective, most confident first
    maps: np.ndarray  # their Grad-CAM maps for `defective`
    maps_before: np.ndarray  # the same classifier's before fine-tuning (ImageNet backbone, initial head)


def _model_inputs(images: np.ndarray) -> np.ndarray:
    """uint8 cells -> float32 (n, SIZE, SIZE, 1), resized as image_features resizes (bilinear, antialiased)."""
    import tensorflow as tf

    resized = tf.image.resize(images[..., None].astype(np.float32), (SIZE, SIZE), method="bilinear", antialias=True)
    return np.round(np.clip(resized.numpy(), 0, 255)).astype(np.float32)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> FineTuned:
    import keras
    from elpv_dataset.utils import load_dataset

    images, probabilities, _ = load_dataset()
    rng = np.random.default_rng(0)
    functional = rng.permutation(np.flatnonzero(probabilities == 0))[:TRAIN_PER_CLASS]
    defective = rng.permutation(np.flatnonzero(probabilities == 1))
    train = np.concatenate([functional, defective[:TRAIN_PER_CLASS]])
    held_out = _model_inputs(images[defective[TRAIN_PER_CLASS : TRAIN_PER_CLASS + 48]])

    keras.utils.set_random_seed(0)
    classifier = build_classifier(ModelConfig(), (SIZE, SIZE, 1), len(CLASS_NAMES))
    before = keras.models.clone_model(classifier)
    before.set_weights(classifier.get_weights())
    classifier.compile(optimizer=keras.optimizers.Adam(3e-4), loss="sparse_categorical_crossentropy")
    labels = (probabilities[train] == 1).astype(np.int64)  # functional 0, defective 1
    classifier.fit(_model_inputs(images[train]), labels, epochs=3, batch_size=16, shuffle=True, verbose=0)

    path = tmp_path_factory.mktemp("saliency") / "classifier.keras"
    with_dihedral_views(classifier, 4).save(path)
    model: Any = keras.models.load_model(path, compile=False)  # keras' loader is unannotated; a Model here
    p_defective = model.predict(held_out, verbose=0)[:, DEFECTIVE]
    confident = np.argsort(-p_defective)[: int((p_defective >= CONFIDENT).sum())][:MAPS]
    assert len(confident) >= 8, f"only {len(confident)} held-out defective cells at P >= {CONFIDENT}: the model is too weak"
    cells = held_out[confident]
    return FineTuned(model, classifier, cells, grad_cams(model, cells, DEFECTIVE), grad_cams(before, cells, DEFECTIVE))


def _rank_correlations(maps: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Spearman's rho of each map with its other; 0 for an other without a ranking (all 0: no positive
    evidence left anywhere), which shares nothing with a trained map."""
    assert maps.std(axis=(1, 2)).all()  # the trained maps have structure to lose
    return np.array([np.corrcoef(rankdata(a), rankdata(b))[0, 1] if b.std() else 0.0 for a, b in zip(maps, others)])


def _heat_inside_and_on_frame(maps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    border = round(FRAME * SIZE)
    inside = np.zeros(maps.shape[1:], dtype=bool)
    inside[border:-border, border:-border] = True
    return maps[:, inside].mean(axis=1), maps[:, ~inside].mean(axis=1)


def _reinitialised(classifier):
    """The single-view classifier with all its weights fresh from its layers' initialisers."""
    import keras

    keras.utils.set_random_seed(1)  # the same weights whichever tests ran before; not the training's seed 0
    return keras.models.clone_model(classifier)  # clone_model initialises anew


def _fresh_head_maps(classifier, cells: np.ndarray, seeds: range) -> list[np.ndarray]:
    """Maps of the trained classifier with its softmax layer re-drawn from Dense's Glorot-uniform initialiser,
    one draw per seed. Several draws: the maps of one random head may share much of the trained one's ranking
    by chance (the backbone's channels tend to fire together)."""
    import keras

    copy = keras.models.clone_model(classifier)
    copy.set_weights(classifier.get_weights())
    head = copy.layers[-1]
    limit = np.sqrt(6.0 / sum(head.kernel.shape))
    maps = []
    for seed in seeds:
        kernel = np.random.default_rng(seed).uniform(-limit, limit, head.kernel.shape).astype(np.float32)
        head.set_weights([kernel, np.zeros(head.bias.shape, np.float32)])
        maps.append(grad_cams(copy, cells, DEFECTIVE))
    return maps


def test_the_last_convolution_is_found_inside_the_nested_backbone(fine_tuned):
    backbone, convolution = last_convolution(fine_tuned.model)
    assert (backbone.name, convolution.name) == ("efficientnet_lite0", "head_conv")
    assert fine_tuned.maps.shape == (len(fine_tuned.cells), SIZE, SIZE) and fine_tuned.maps.dtype == np.float32
    assert fine_tuned.maps.min() >= 0.0 and np.allclose(fine_tuned.maps.max(axis=(1, 2)), 1.0)


def test_a_loaded_model_of_dihedral_views_is_explained_through_its_single_view(fine_tuned):
    # The saved model averages four views; inspectors get the plain single view's map, as trained in memory.
    np.testing.assert_allclose(grad_cams(fine_tuned.in_memory, fine_tuned.cells, DEFECTIVE), fine_tuned.maps, atol=1e-5)
    # One image alone, and a batch with a class per image, give what the whole batch gave.
    one = grad_cam(fine_tuned.model, fine_tuned.cells[0], DEFECTIVE)
    np.testing.assert_allclose(one, fine_tuned.maps[0], atol=1e-4)
    pair = grad_cams(fine_tuned.model, fine_tuned.cells[:2], [DEFECTIVE, DEFECTIVE])
    np.testing.assert_allclose(pair, fine_tuned.maps[:2], atol=1e-4)


def test_randomised_weights_change_the_map(fine_tuned):
    """Adebayo et al. 2018: a map that survives re-initialising the weights explains the image, not the model."""
    classifier = single_view(fine_tuned.model)
    again = _rank_correlations(fine_tuned.maps, grad_cams(fine_tuned.model, fine_tuned.cells, DEFECTIVE))
    heads = [
        _rank_correlations(fine_tuned.maps, maps).mean() for maps in _fresh_head_maps(classifier, fine_tuned.cells, range(4))
    ]
    whole = _rank_correlations(fine_tuned.maps, grad_cams(_reinitialised(classifier), fine_tuned.cells, DEFECTIVE))
    print(
        f"Spearman to the trained maps: itself {again.mean():.3f}, fresh heads {np.round(heads, 3).tolist()}, "
        f"all weights fresh {whole.mean():.3f}"
    )
    np.testing.assert_allclose(again, 1.0)
    assert np.mean(heads) < 0.5 and whole.mean() < 0.5


def test_on_defective_cells_the_heat_lies_on_the_cell_not_its_frame(fine_tuned):
    inside, frame = _heat_inside_and_on_frame(fine_tuned.maps)
    inside_before, frame_before = _heat_inside_and_on_frame(fine_tuned.maps_before)
    print(
        f"mean heat inside / on the frame: fine-tuned {inside.mean():.3f} / {frame.mean():.3f} "
        f"({(inside > frame).sum()} of {len(inside)} cells hotter inside), before fine-tuning "
        f"{inside_before.mean():.3f} / {frame_before.mean():.3f} ({(inside_before > frame_before).sum()})"
    )
    assert inside.mean() > 1.3 * frame.mean()
    assert (inside > frame).mean() >= 0.75
    # Learned, not geometry: before fine-tuning the same network looked at least as much at the cell's edge.
    assert (inside - frame).mean() > (inside_before - frame_before).mean() + 0.1


def test_a_model_without_convolution_is_refused_and_a_flat_one_explained():
    import keras

    pixels = keras.Input((16, 16, 1))
    dense = keras.Model(pixels, keras.layers.Dense(2, activation="softmax")(keras.layers.Flatten()(pixels)), name="dense_only")
    with pytest.raises(SaliencyError, match="'dense_only' has no 2-D convolution"):
        grad_cam(dense, np.zeros((16, 16, 1), np.float32), 1)

    # No nested backbone: the convolution and its activation sit in the classifier itself.
    hidden = keras.layers.Conv2D(4, 3, padding="same", name="conv")(pixels)
    hidden = keras.layers.ReLU(name="conv_relu")(hidden)
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(hidden))
    flat = keras.Model(pixels, outputs)
    assert [layer.name for layer in last_convolution(flat)] == ["conv"]
    image = np.random.default_rng(0).uniform(0, 255, (16, 16)).astype(np.float32)  # grey, without its channel axis
    assert grad_cam(flat, image, 0).shape == (16, 16)
    with pytest.raises(SaliencyError, match="class indices must lie in 0..1"):
        grad_cam(flat, image, 2)
    with pytest.raises(SaliencyError, match=r"takes images \(16, 16, 1\)"):
        grad_cam(flat, np.zeros((8, 8, 1)), 0)
