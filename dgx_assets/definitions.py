"""The dgx_assets code location: Dagster loads the defs folder (one folder per UI group) and adds the executor.

Kept cheap to import (no tensorflow, paddle, pyspark or great_expectations here or under defs/): the webserver,
the daemon and every sensor tick load it. The environment is read when Dagster loads the definitions, not when
this module is imported.
"""

from pathlib import Path

import dagster as dg

from dgx_assets import settings


def executor_for(deployment: str) -> dg.ExecutorDefinition:
    """One process per run locally and on Spark Standalone (one SparkSession shared by the run's assets), one
    Kubernetes pod per step with dagster-k8s."""
    if deployment == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
        dg.Definitions(executor=executor_for(settings.environment().deployment)),
    )
