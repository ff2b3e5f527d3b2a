"""The dgx_assets code location: per-domain definitions merged, resources chosen per deployment.

Kept cheap to import (no tensorflow, paddle, pyspark or great_expectations here): the webserver, the
daemon and every sensor tick load it.
"""

from collections.abc import Sequence
from typing import cast

import dagster as dg

from dgx_assets import settings
from dgx_assets.challenger import definitions as challenger
from dgx_assets.edge import definitions as edge
from dgx_assets.generation import definitions as generation
from dgx_assets.generation.resources import ErnieServingResource
from dgx_assets.ingest import definitions as ingest
from dgx_assets.reporting import definitions as reporting
from dgx_assets.resources import LakeResource, MlflowResource
from dgx_assets.spark.resource import SparkResource
from dgx_assets.training import definitions as training
from dgx_assets.tuning import definitions as tuning

# Every deployment reads its URIs from the environment when a run starts; what differs is how steps run:
# one process per run locally and on Spark Standalone (one SparkSession shared by the run's assets),
# one Kubernetes pod per step with dagster-k8s.
RESOURCES = {
    "spark": SparkResource(),
    "lake": LakeResource(),
    "mlflow": MlflowResource(),
    "ernie": ErnieServingResource(),
}


# The UI's asset groups are the pipeline's stages: ingest, model, edge, generation, reporting. Each asset names its
# own, except training's two (training/assets.py calls both "training"): image_features runs with each batch's ingest
# (the landing sensor's job), trained_model beside the other models.
TRAINING_STAGES = {"image_features": "ingest", "trained_model": "model"}


def _staged(domain: dg.Definitions, stages: dict[str, str]) -> dg.Definitions:
    defined = cast(Sequence[dg.AssetsDefinition], domain.assets)  # the domains define assets only, no source assets
    assets = dg.map_asset_specs(lambda spec: spec.replace_attributes(group_name=stages[spec.key.to_user_string()]), defined)
    return dg.Definitions(
        assets=assets, asset_checks=domain.asset_checks, jobs=domain.jobs, schedules=domain.schedules, sensors=domain.sensors
    )


def _executor(deployment: str):
    if deployment == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor


defs = dg.Definitions.merge(
    ingest.defs,
    _staged(training.defs, TRAINING_STAGES),
    challenger.defs,
    tuning.defs,
    edge.defs,
    generation.defs,
    reporting.defs,
    dg.Definitions(resources=RESOURCES, executor=_executor(settings.deployment())),
)
