"""Resources shared across domains. Defaults come from the environment when a resource initialises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import dagster as dg

from dgx_assets import settings
from dgx_assets.tracking.store import TrackingConfig, TrackingSettings

if TYPE_CHECKING:
    from dgx_assets.lake import Lake


class LakeResource(dg.ConfigurableResource):
    """Where assets write (DGX_LAKE_ROOT), where images land (DGX_LANDING_URI), the prompts (DGX_PROMPTS_URI), the
    Iceberg catalog of the lake's tables (DGX_CATALOG_URI)."""

    root: Optional[str] = None
    landing: Optional[str] = None
    prompts: Optional[str] = None
    catalog: Optional[str] = None  # None: DGX_CATALOG_URI, else a sqlite catalog beside a local lake
    # Who writes the tables' Parquet files on the executors: "arrow" (pyarrow in a Python data source) or "spark"
    # (Spark's own writer); BENCHMARKS.md, 1 has both measured.
    table_writer: str = "arrow"

    @property
    def lake(self) -> Lake:
        from dgx_assets.lake import Lake  # pyarrow: loaded by runs, not by every sensor tick of the code location

        return Lake(self.root or settings.lake_root(), catalog_uri=self.catalog)

    @property
    def landing_uri(self) -> str:
        return self.landing or settings.landing_uri(self.lake.root)

    @property
    def prompts_uri(self) -> str:
        return self.prompts or settings.prompts_uri(self.lake.root)


class MlflowResource(dg.ConfigurableResource, TrackingSettings):
    """The MLflow tracking store and the registered model every training run versions."""

    @property
    def resolved_tracking_uri(self) -> str:
        return self.tracking_uri or settings.mlflow_tracking_uri()

    @property
    def resolved_ui_url(self) -> str:
        return (self.ui_url or "").rstrip("/") or settings.mlflow_ui_url()

    def tracking_config(self, registered_model_name: Optional[str] = None) -> TrackingConfig:
        """The settings a tracked run takes, resolved now (another registered name for another model family)."""
        return TrackingConfig(
            tracking_uri=self.resolved_tracking_uri,
            experiment_name=self.experiment_name,
            registered_model_name=registered_model_name or self.registered_model_name,
            ui_url=self.resolved_ui_url,
            dagster_ui_url=settings.dagster_ui_url(),
        )
