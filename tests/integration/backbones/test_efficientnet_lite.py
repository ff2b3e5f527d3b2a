"""EfficientNet-Lite0 and -Lite2 in Keras with the packaged ImageNet weights: each must still recognise ImageNet
classes, use every tensor of its checkpoint, and fine-tune as a classifier of standard Keras layers only."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support import torch_files

from dgx_assets.backbones import efficientnet_lite
from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict
from dgx_assets.backbones.efficientnet_lite import LITE0, LITE2, VARIANTS

CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
ESPRESSO = 967
EVERY_VARIANT = pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))


@pytest.fixture(scope="module", params=VARIANTS.values(), ids=list(VARIANTS))
def imagenet(request):
    """(variant, its ImageNet classifier at its native resolution)."""
    variant = request.param
    return variant, efficientnet_lite.pretrained_lite(variant, efficientnet_lite.packaged_weights(variant), include_top=True)


def _top5(model, picture: np.ndarray) -> list[int]:
    import tensorflow as tf

    side = model.input_shape[1]
    pixels = tf.image.resize(picture[None].astype("float32"), [side, side], antialias=True)
    normalised = (pixels - efficientnet_lite.INPUT_MEAN) / efficientnet_lite.INPUT_STD
    return list(np.argsort(-np.asarray(model(normalised, training=False))[0])[:5])


def test_imagenet_weights_recognise_real_photographs(imagenet):
    from skimage import data

    _, model = imagenet
    assert set(_top5(model, data.chelsea())[:3]) <= CATS  # scikit-image's photograph of a cat
    assert _top5(model, data.coffee())[0] == ESPRESSO


def test_every_checkpoint_tensor_becomes_a_keras_weight(imagenet):
    variant, model = imagenet
    state = read_state_dict(efficientnet_lite.packaged_weights(variant).path)
    assert model.input_shape == (None, variant.resolution, variant.resolution, 3)
    assert model.count_params() == sum(v.size for k, v in state.items() if not k.endswith("num_batches_tracked"))
    assert efficientnet_lite.block_name(variant.blocks - 1) in {layer.name.split("_")[0] for layer in model.layers}


@EVERY_VARIANT
def test_a_checkpoint_with_tensors_the_build_does_not_use_is_refused(tmp_path, variant):
    state = read_state_dict(efficientnet_lite.packaged_weights(variant).path)
    state["_blocks.3._se_reduce.weight"] = np.zeros((4, 24, 1, 1), np.float32)  # squeeze-excite: EfficientNet, not Lite
    with pytest.raises(CheckpointError, match=rf"tensors not used by {variant.title}: \['_blocks\.3\._se_reduce\.weight'\]"):
        efficientnet_lite.load_torch_weights(efficientnet_lite.build_lite(variant, (32, 32, 3)), state)


def test_a_users_own_weights_file_loads(tmp_path, imagenet):
    """A .pth of the same layout (here: the packaged one with its classifier scaled) replaces the packaged one."""
    variant, packaged = imagenet
    state = read_state_dict(efficientnet_lite.packaged_weights(variant).path)
    state["_fc.weight"] = state["_fc.weight"] * 2.0
    path = tmp_path / "own.pth"
    path.write_bytes(torch_files.zip_checkpoint(state))

    weights = efficientnet_lite.weights_file(str(path))
    assert weights.package is None and "user file" in weights.describe()
    own = efficientnet_lite.pretrained_lite(variant, weights, include_top=True)
    np.testing.assert_allclose(
        own.get_layer("imagenet_logits").get_weights()[0], packaged.get_layer("imagenet_logits").get_weights()[0] * 2.0
    )


@EVERY_VARIANT
def test_weights_of_another_architecture_are_refused(tmp_path, variant):
    path = tmp_path / "resnet.pth"
    path.write_bytes(torch_files.legacy_checkpoint({"conv1.weight": np.zeros((64, 3, 7, 7), np.float32)}))
    with pytest.raises(CheckpointError, match=f"not an {variant.title} state dict"):
        efficientnet_lite.pretrained_lite(variant, efficientnet_lite.weights_file(str(path)))


@pytest.mark.parametrize("built, weights", [(LITE0, LITE2), (LITE2, LITE0)], ids=["lite2-into-lite0", "lite0-into-lite2"])
def test_the_other_variants_weights_are_refused_naming_their_backbone(built, weights):
    model = efficientnet_lite.build_lite(built, (32, 32, 3))
    state = read_state_dict(efficientnet_lite.packaged_weights(weights).path)
    refusal = rf"has {weights.blocks} blocks, {built.title} has {built.blocks}: .* but an {weights.title} one"
    with pytest.raises(CheckpointError, match=rf"{refusal} \(backbone {weights.name}\)"):
        efficientnet_lite.load_torch_weights(model, state)


@EVERY_VARIANT
def test_any_input_size_gives_the_1280_channel_feature_map(variant):
    model = efficientnet_lite.build_lite(variant, (96, 64, 3))
    assert model.output_shape == (None, 3, 2, efficientnet_lite.EMBEDDING_SIZE)


def test_the_lite0_names_of_before_lite2_still_build_lite0():
    assert efficientnet_lite.build_lite0((32, 32, 3)).name == LITE0.name
    assert efficientnet_lite.packaged_weights().package == LITE0.package


@pytest.fixture(scope="module")
def lite2_classifier():
    """A fine-tunable Lite2 defect classifier at Lite2's native 260 px, on grey images, fine-tuned from block 12."""
    from dgx_assets.training.config import ModelConfig
    from dgx_assets.training.model import build_classifier

    return build_classifier(ModelConfig(backbone="efficientnet_lite2", trainable_from_block=12), (260, 260, 1), 2)


def test_a_lite2_classifier_fine_tunes_only_from_trainable_from_block_up(lite2_classifier):
    backbone = lite2_classifier.get_layer(LITE2.name)
    assert lite2_classifier.input_shape == (None, 260, 260, 1)
    blocks = {layer.name[: len("block00")] for layer in backbone.layers if layer.name.startswith("block")}
    assert blocks == {efficientnet_lite.block_name(index) for index in range(21)}
    weighted = [layer for layer in backbone.layers if layer.weights]

    def below_block_12(name: str) -> bool:
        return name.startswith("stem_") or (name.startswith("block") and int(name[5:7]) < 12)

    frozen = {layer.name for layer in weighted if not layer.trainable}
    assert frozen == {layer.name for layer in weighted if below_block_12(layer.name)}
    assert {"block12_expand_conv", "block20_project_bn", "head_conv", "head_bn"} <= {
        layer.name for layer in weighted if layer.trainable
    }


def test_a_saved_lite2_classifier_reloads_with_plain_keras(tmp_path, lite2_classifier):
    """Standard Keras layers only: a process that never imports dgx_assets loads it and computes the same."""
    path = tmp_path / "lite2.keras"
    lite2_classifier.save(path)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 260, 260, 1)).astype(np.float32)
    np.save(tmp_path / "pixels.npy", pixels)
    script = (
        "import sys\nimport keras, numpy as np\n"
        "model = keras.models.load_model(sys.argv[1], compile=False)\n"
        "assert not [name for name in sys.modules if name.startswith('dgx_assets')]\n"
        "np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "pixels.npy"), str(tmp_path / "out.npy")],
        check=True,
        timeout=300,
    )
    expected = np.asarray(lite2_classifier(pixels, training=False))
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-5)


@EVERY_VARIANT
def test_a_weights_file_as_the_embedding_is_read_as_its_own_variant(variant):
    """`embedding` given a .pth: its block count picks the variant, so a Lite2 file embeds as Lite2 does."""
    from dgx_assets.training.model import load_embedding_model

    pixels = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 1)).astype(np.float32)
    from_file = load_embedding_model(efficientnet_lite.packaged_weights(variant).path, (32, 32, 1))
    by_name = load_embedding_model(variant.name, (32, 32, 1))
    assert from_file.output_shape == (None, efficientnet_lite.EMBEDDING_SIZE)
    np.testing.assert_allclose(np.asarray(from_file(pixels)), np.asarray(by_name(pixels)), rtol=1e-5, atol=1e-6)
