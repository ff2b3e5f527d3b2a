"""The settings of hyperparameter_search, declared once.

A plain pydantic model, cheap to import: the plain-Python search (search.py, tracking.py) takes it, and the
asset's Dagster config subclasses it, so the launchpad shows exactly these fields, defaults and descriptions.
Each field carries its bounds, and the ranges their order: a wrong value is refused when the config is made.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SearchConfigError(ValueError):
    """A search setting cannot work; the message names the setting."""


class SearchConfig(BaseModel):
    """hyperparameter_search: how many trials, how ASHA stops them, and the ranges searched."""

    model_config = ConfigDict(frozen=True)

    num_samples: int = Field(12, ge=1, description="Trials")
    max_epochs: int = Field(20, ge=1, description="Epochs per trial unless ASHA stops it sooner")
    grace_period: int = Field(3, ge=1, description="Epochs every trial gets before ASHA may stop it")
    reduction_factor: int = Field(3, ge=2, description="ASHA keeps the best 1/reduction_factor of trials at each rung")
    learning_rate_min: float = Field(1e-4, gt=0, description="Lower end of the log-uniform learning-rate range")
    learning_rate_max: float = Field(3e-2, gt=0, description="Upper end of the log-uniform learning-rate range")
    dropout_max: float = Field(0.6, ge=0, lt=1, description="Dropout is drawn uniformly from [0, dropout_max]")
    batch_sizes: list[int] = Field([16, 32, 64], min_length=1, description="Batch sizes to choose from")
    ray_worker_nodes: Optional[int] = Field(
        None, ge=1, description="Ray worker nodes on the Spark executors; empty: one per task slot (at most 8)"
    )
    seed: int = Field(42, description="Seeds the search and every trial")

    @model_validator(mode="after")
    def _ranges_in_order(self) -> SearchConfig:
        if self.grace_period > self.max_epochs:
            raise ValueError(f"grace_period ({self.grace_period}) exceeds max_epochs ({self.max_epochs})")
        if self.learning_rate_min > self.learning_rate_max:
            raise ValueError(f"learning_rate_min ({self.learning_rate_min}) exceeds learning_rate_max ({self.learning_rate_max})")
        if min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {list(self.batch_sizes)}")
        return self
