"""EfficientNet-Lite0 in Keras with the packaged ImageNet weights: it must still recognise ImageNet classes."""

from __future__ import annotations

import numpy as np
import pytest
from support import torch_files

from dgx_assets.backbones import efficientnet_lite
from dgx_assets.backbones.checkpoint import CheckpointError

CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
ESPRESSO = 967


@pytest.fixture(scope="module")
def imagenet_lite0():
    return efficientnet_lite.pretrained_lite0(efficientnet_lite.packaged_weights(), include_top=True)


def _top5(model, picture: np.ndarray) -> list[int]:
    import tensorflow as tf

    pixels = tf.image.resize(picture[None].astype("float32"), [224, 224], antialias=True)
    normalised = (pixels - efficientnet_lite.INPUT_MEAN) / efficientnet_lite.INPUT_STD
    return list(np.argsort(-np.asarray(model(normalised, training=False))[0])[:5])


def test_imagenet_weights_recognise_real_photographs(imagenet_lite0):
    from skimage import data

    assert set(_top5(imagenet_lite0, data.chelsea())[:3]) <= CATS  # scikit-image's photograph of a cat
    assert _top5(imagenet_lite0, data.coffee())[0] == ESPRESSO


def test_a_users_own_weights_file_loads(tmp_path, imagenet_lite0):
    """A .pth of the same layout (here: the packaged one with its classifier scaled) replaces the packaged one."""
    from dgx_assets.backbones.checkpoint import read_state_dict

    state = read_state_dict(efficientnet_lite.packaged_weights().path)
    state["_fc.weight"] = state["_fc.weight"] * 2.0
    path = tmp_path / "own.pth"
    path.write_bytes(torch_files.zip_checkpoint(state))

    weights = efficientnet_lite.weights_file(str(path))
    assert weights.package is None and "user file" in weights.describe()
    own = efficientnet_lite.pretrained_lite0(weights, include_top=True)
    np.testing.assert_allclose(
        own.get_layer("imagenet_logits").get_weights()[0], imagenet_lite0.get_layer("imagenet_logits").get_weights()[0] * 2.0
    )


def test_weights_of_another_architecture_are_refused(tmp_path):
    path = tmp_path / "resnet.pth"
    path.write_bytes(torch_files.legacy_checkpoint({"conv1.weight": np.zeros((64, 3, 7, 7), np.float32)}))
    with pytest.raises(CheckpointError, match="not an EfficientNet-Lite0 state dict"):
        efficientnet_lite.pretrained_lite0(efficientnet_lite.weights_file(str(path)))


def test_any_input_size_gives_the_1280_channel_feature_map():
    model = efficientnet_lite.build_lite0((96, 64, 3))
    assert model.output_shape == (None, 3, 2, efficientnet_lite.EMBEDDING_SIZE)
