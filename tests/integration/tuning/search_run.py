"""Run in its own process by test_hyperparameter_search.py: a local-cluster Spark (two executors of one core),
so no SparkSession of another test (local[2]) is reused, and Ray's global state dies with the process.

argv: lake root, tracking URI. Prints one JSON line with what the test checks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for support.*

import dagster as dg
from support.embedding_features import write_embedding_features

from dgx_assets.defs.model.search import hyperparameter_search
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.tuning.search import ray_on_spark

LOCAL_CLUSTER = {
    "spark.master": "local-cluster[2,1,1024]",
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
}
TINY = {"num_samples": 4, "max_epochs": 6, "grace_period": 1, "reduction_factor": 2, "batch_sizes": [16, 32]}


def spark_jobs_running(spark) -> list[int]:
    return list(spark.sparkContext.statusTracker().getActiveJobsIds())


def main(lake: str, tracking_uri: str) -> None:
    import ray

    keys = write_embedding_features(Path(lake))
    spark_resource = SparkResource(spark_conf=LOCAL_CLUSTER)
    with dg.build_init_resource_context() as init:
        spark_resource.setup_for_execution(init)
    spark = spark_resource.spark_session
    report = {"master": spark.sparkContext.master, "keys": keys}

    # A failure inside the block still tears the cluster down: no Ray connection, no Spark job left holding nodes.
    try:
        with ray_on_spark(spark, 2):
            report["nodes_during"] = len([n for n in ray.nodes() if n["Alive"]])
            report["jobs_during"] = len(spark_jobs_running(spark))
            raise RuntimeError("a trial blew up")
    except RuntimeError as error:
        report["raised"] = str(error)
    deadline = time.monotonic() + 60
    while spark_jobs_running(spark) and time.monotonic() < deadline:
        time.sleep(0.5)
    report["ray_connected_after"] = ray.is_initialized()
    report["jobs_after"] = len(spark_jobs_running(spark))

    result = dg.materialize(
        [hyperparameter_search],
        resources={"spark": spark_resource, "lake": LakeResource(root=lake), "mlflow": MlflowResource(tracking_uri=tracking_uri)},
        run_config=dg.RunConfig({"hyperparameter_search": {"config": TINY}}),
        instance=dg.DagsterInstance.ephemeral(),
    )
    metadata = result.asset_materializations_for_node("hyperparameter_search")[0].metadata
    report |= {
        "success": result.success,
        "dagster_run_id": result.run_id,
        "mlflow_run_id": metadata["mlflow_run_id"].value,
        "trials": metadata["trials"].value,
        "stopped_early": metadata["trials_stopped_early"].value,
        "ray_connected_end": ray.is_initialized(),
        "jobs_end": len(spark_jobs_running(spark)),
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
