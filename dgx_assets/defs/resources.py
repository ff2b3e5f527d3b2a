"""Resources shared across domains. Defaults come from the environment when a resource initialises."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

import dagster as dg
from pydantic import PrivateAttr

from dgx_assets import settings
from dgx_assets.spark.profiles import profile_conf
from dgx_assets.tracking.store import TrackingConfig, TrackingSettings

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake


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
        from dgx_assets.lake.store import Lake  # pyarrow: loaded by runs, not by every sensor tick of the code location

        return Lake(self.root or settings.environment().lake_root, catalog_uri=self.catalog)

    @property
    def landing_uri(self) -> str:
        return self.landing or settings.environment().with_lake(self.lake.root).landing_uri

    @property
    def prompts_uri(self) -> str:
        return self.prompts or settings.environment().with_lake(self.lake.root).prompts_uri


class MlflowResource(dg.ConfigurableResource, TrackingSettings):
    """The MLflow tracking store and the registered model every training run versions. A field left None takes
    the environment's value (MLFLOW_TRACKING_URI, DGX_MLFLOW_UI_URL) in `tracking_config()`, the one place."""

    def tracking_config(self, registered_model_name: Optional[str] = None) -> TrackingConfig:
        """The settings a tracked run takes, resolved now (another registered name for another model family)."""
        env = settings.environment()
        return TrackingConfig(
            tracking_uri=self.tracking_uri or env.mlflow_tracking_uri,
            experiment_name=self.experiment_name,
            registered_model_name=registered_model_name or self.registered_model_name,
            ui_url=(self.ui_url or "").rstrip("/") or env.mlflow_ui_url,
            dagster_ui_url=env.dagster_ui_url,
        )


class SparkResource(dg.ConfigurableResource):
    """A SparkSession shared by every asset of a run, configured for DGX_DEPLOYMENT (`local`, `standalone` or
    `k8s`): the deployment the executor follows too (definitions.py), so it is no field here."""

    master: Optional[str] = None  # None: DGX_SPARK_MASTER
    spark_conf: dict[str, Any] = {}  # overrides, applied last

    _pyspark: Any = PrivateAttr(default=None)

    @property
    def spark_config(self) -> dict[str, str]:
        env = settings.environment()
        conf = profile_conf(env.deployment, self.master or env.spark_master)
        return conf | {key: str(value) for key, value in self.spark_conf.items()}

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        conf = self.spark_config
        settings.apply_process_defaults()
        if conf.get("spark.eventLog.dir", "").startswith("file:"):
            from urllib.parse import urlparse

            os.makedirs(urlparse(conf["spark.eventLog.dir"]).path, exist_ok=True)
        from dagster_pyspark import LazyPySparkResource

        # getOrCreate on first use: every asset of an in-process run shares this one session, and a step that
        # may use Spark (trained_model with distribution single) does not start it for nothing.
        self._pyspark = LazyPySparkResource(spark_config=conf)

    @property
    def spark_session(self):
        if self._pyspark is None:
            raise dg.DagsterInvariantViolationError("SparkResource used outside a run (no session was built)")
        return self._pyspark.spark_session


# One SparkSession, lake and MLflow store per run, whatever the deployment: the environment says where they are.
@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={"spark": SparkResource(), "lake": LakeResource(), "mlflow": MlflowResource()})
