"""The settings of challenger_model, declared once.

A plain pydantic model, cheap to import: the plain-Python trainer (xgb.py, tracking.py) takes it, and the
asset's Dagster config subclasses it, adding only what the asset itself decides (the registered model's
name). Each field carries its bounds: a wrong value is refused when the config is made, naming the setting.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Device = Literal["auto", "cpu", "cuda"]


class ChallengerConfig(BaseModel):
    """challenger_model: the gradient-boosted trees and where they train."""

    model_config = ConfigDict(frozen=True)

    max_depth: int = Field(4, ge=1, description="Tree depth")
    n_estimators: int = Field(
        300, ge=1, description="Most boosting rounds (early stopping on the validation split may end sooner)"
    )
    learning_rate: float = Field(0.1, gt=0, le=1, description="Shrinkage per round")
    subsample: float = Field(0.8, gt=0, le=1, description="Rows sampled per tree")
    colsample_bytree: float = Field(0.5, gt=0, le=1, description="Embedding dimensions sampled per tree")
    early_stopping_rounds: int = Field(20, ge=1, description="Rounds without validation mlogloss improvement before stopping")
    num_workers: Optional[int] = Field(
        None, ge=1, description="XGBoost workers, one Spark task each; empty: the cluster's task slots (at most 8)"
    )
    device: Device = Field("auto", description="auto: cuda when Spark gives tasks GPUs (the GPU hist method), else cpu")
    latency_images: int = Field(
        100, ge=1, description="Test images classified one at a time on the driver to time the booster's inference"
    )
    seed: int = Field(42, description="XGBoost random_state")
