"""The settings of hyperparameter_search, declared once.

A plain pydantic model, cheap to import: the plain-Python search (search.py, tracking.py) takes it, and the
asset's Dagster config subclasses it, so the launchpad shows exactly these fields, defaults and descriptions.
``check()`` raises an error that names the setting to fix.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class SearchConfigError(ValueError):
    """A search setting cannot work; the message names the setting."""


class SearchConfig(BaseModel):
    """hyperparameter_search: how many trials, how ASHA stops them, and the ranges searched."""

    model_config = ConfigDict(frozen=True)

    num_samples: int = Field(12, description="Trials")
    max_epochs: int = Field(20, description="Epochs per trial unless ASHA stops it sooner")
    grace_period: int = Field(3, description="Epochs every trial gets before ASHA may stop it")
    reduction_factor: int = Field(3, description="ASHA keeps the best 1/reduction_factor of trials at each rung")
    learning_rate_min: float = Field(1e-4, description="Lower end of the log-uniform learning-rate range")
    learning_rate_max: float = Field(3e-2, description="Upper end of the log-uniform learning-rate range")
    dropout_max: float = Field(0.6, description="Dropout is drawn uniformly from [0, dropout_max]")
    batch_sizes: list[int] = Field([16, 32, 64], description="Batch sizes to choose from")
    ray_worker_nodes: Optional[int] = Field(
        None, description="Ray worker nodes on the Spark executors; empty: one per task slot (at most 8)"
    )
    seed: int = Field(42, description="Seeds the search and every trial")

    def check(self) -> None:
        for name in ("num_samples", "max_epochs", "grace_period"):
            if getattr(self, name) < 1:
                raise SearchConfigError(f"{name} must be at least 1 (setting {name!r}), got {getattr(self, name)}")
        if self.grace_period > self.max_epochs:
            raise SearchConfigError(
                f"grace_period ({self.grace_period}) exceeds max_epochs ({self.max_epochs}) "
                "(settings 'grace_period', 'max_epochs')"
            )
        if self.reduction_factor < 2:
            raise SearchConfigError(
                f"reduction_factor must be at least 2 (setting 'reduction_factor'), got {self.reduction_factor}"
            )
        if not 0 < self.learning_rate_min <= self.learning_rate_max:
            raise SearchConfigError(
                f"need 0 < learning_rate_min <= learning_rate_max, got {self.learning_rate_min} and "
                f"{self.learning_rate_max} (settings 'learning_rate_min', 'learning_rate_max')"
            )
        if not 0 <= self.dropout_max < 1:
            raise SearchConfigError(f"dropout_max must be in [0, 1) (setting 'dropout_max'), got {self.dropout_max}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise SearchConfigError(f"batch_sizes must be positive (setting 'batch_sizes'), got {list(self.batch_sizes)}")
        if self.ray_worker_nodes is not None and self.ray_worker_nodes < 1:
            raise SearchConfigError(
                f"ray_worker_nodes must be at least 1 or empty (setting 'ray_worker_nodes'), got {self.ray_worker_nodes}"
            )
