"""The settings of challenger_model, declared once.

A plain pydantic model, cheap to import: the plain-Python trainer (xgb.py, tracking.py) takes it, and the
asset's Dagster config subclasses it, adding only what the asset itself decides (the registered model's
name). ``check()`` raises an error that names the setting to fix.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

DEVICES = ("auto", "cpu", "cuda")


class ChallengerConfigError(ValueError):
    """A challenger setting cannot work; the message names the setting."""


class ChallengerConfig(BaseModel):
    """challenger_model: the gradient-boosted trees and where they train."""

    model_config = ConfigDict(frozen=True)

    max_depth: int = Field(4, description="Tree depth")
    n_estimators: int = Field(300, description="Most boosting rounds (early stopping on the validation split may end sooner)")
    learning_rate: float = Field(0.1, description="Shrinkage per round")
    subsample: float = Field(0.8, description="Rows sampled per tree")
    colsample_bytree: float = Field(0.5, description="Embedding dimensions sampled per tree")
    early_stopping_rounds: int = Field(20, description="Rounds without validation mlogloss improvement before stopping")
    num_workers: Optional[int] = Field(
        None, description="XGBoost workers, one Spark task each; empty: the cluster's task slots (at most 8)"
    )
    device: str = Field("auto", description="auto: cuda when Spark gives tasks GPUs (the GPU hist method), else cpu")
    latency_images: int = Field(
        100, description="Test images classified one at a time on the driver to time the booster's inference"
    )
    seed: int = Field(42, description="XGBoost random_state")

    def check(self) -> None:
        for name in ("max_depth", "n_estimators", "early_stopping_rounds", "latency_images"):
            if getattr(self, name) < 1:
                raise ChallengerConfigError(f"{name} must be at least 1 (setting {name!r}), got {getattr(self, name)}")
        for name in ("learning_rate", "subsample", "colsample_bytree"):
            if not 0 < getattr(self, name) <= 1:
                raise ChallengerConfigError(f"{name} must be in (0, 1] (setting {name!r}), got {getattr(self, name)}")
        if self.num_workers is not None and self.num_workers < 1:
            raise ChallengerConfigError(
                f"num_workers must be at least 1 or empty (setting 'num_workers'), got {self.num_workers}"
            )
        if self.device not in DEVICES:
            raise ChallengerConfigError(f"device must be auto, cpu or cuda (setting 'device'), got {self.device!r}")
