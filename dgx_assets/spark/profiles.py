"""Spark settings per deployment profile (local, Spark Standalone, Kubernetes), before the user's overrides.

Imported by the code location: no pyspark here (the session is built by the Spark resource in a run).
"""

from __future__ import annotations

import sys

from dgx_assets import settings


def profile_conf(deployment: str, master: str | None) -> dict[str, str]:
    """Spark settings for a deployment, before the user's overrides; the rest comes from the environment now."""
    env = settings.environment()
    common = {
        "spark.app.name": "dgx_assets",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "256",
        "spark.sql.parquet.compression.codec": "zstd",
        # Iceberg's timestamps are microseconds; Spark's default INT96 is not an Iceberg type (its own writer).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.showConsoleProgress": "false",
        "spark.eventLog.enabled": "true",
    }
    if deployment == "local":
        event_dir = env.state_dir / "spark-events"
        return common | {
            "spark.master": master or "local[*]",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "4g",
            # A local JVM lives for one Dagster run, too short for C2's compilations to pay back: the JIT
            # kept compiling through five ingest runs in a JFR profile. C1 alone cut the JVM's CPU by ~45%
            # on ingest and features and its start-up from 16 to 9 CPU-s (BENCHMARKS.md, 1 and 2).
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.sql.shuffle.partitions": "8",
            "spark.eventLog.dir": event_dir.as_uri(),
            "spark.history.fs.logDirectory": event_dir.as_uri(),
            # Plain local[N] never hands tasks GPU addresses: asking for task GPUs there hangs the job.
        }
    if not master:
        raise ValueError(f"DGX_DEPLOYMENT={deployment} needs DGX_SPARK_MASTER (a spark:// or k8s:// URL)")
    gpu = {
        # One GPU per executor, shared by its tasks through a fractional amount (the spark-rapids practice):
        # a reused Python worker then never sees a different GPU address.
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "0.25",
        "spark.executor.cores": "4",
        "spark.executor.memory": "8g",
        "spark.network.timeout": "120s",
        "spark.eventLog.dir": env.spark_event_log,
    }
    if deployment == "standalone":
        if not master.startswith("spark://"):
            raise ValueError(f"DGX_SPARK_MASTER={master!r}: the standalone profile needs a spark://host:port URL")
        return common | gpu | {"spark.master": master}
    if not master.startswith("k8s://"):
        raise ValueError(f"DGX_SPARK_MASTER={master!r}: the k8s profile needs a k8s://https://host:port URL")
    return (
        common
        | gpu
        | {
            "spark.master": master,
            "spark.submit.deployMode": "client",
            "spark.kubernetes.namespace": env.k8s_namespace,
            "spark.kubernetes.container.image": env.spark_image,
            "spark.executor.instances": "2",
            "spark.kubernetes.executor.request.cores": "4",
            "spark.kubernetes.executor.limit.cores": "4",
            "spark.executor.resource.gpu.vendor": "nvidia.com",
            "spark.executor.resource.gpu.discoveryScript": "/opt/dgx_assets/deploy/spark/gpu-discovery.sh",
            "spark.kubernetes.executor.node.selector.nvidia.com/gpu.present": "true",
            # The template adds the GPU-node toleration and a non-root user (deploy/spark/executor-pod-template.yaml).
            "spark.kubernetes.executor.podTemplateFile": "/opt/dgx_assets/deploy/spark/executor-pod-template.yaml",
            "spark.kubernetes.executor.podTemplateContainerName": "executor",
            # Client mode: the step pod is the driver; executors reach it on the pod's own address.
            "spark.driver.host": env.pod_ip,
            "spark.driver.bindAddress": "0.0.0.0",
        }
    )
