"""Kubernetes placement for runs and steps, as dagster-k8s tags (see deploy/README.md).

GPU assets put `gpu_step_tags()` in their `op_tags`: with `k8s_job_executor` (the `k8s` deployment
profile) their step pod then asks for `nvidia.com/gpu`, lands on a GPU node and tolerates its taint.
Jobs and schedules put `TRAINING_RUN_TAGS` / `INTERACTIVE_RUN_TAGS` on runs, which the queued run
coordinator in deploy/dagster.yaml limits. Plain dicts only: cheap to import, ignored off Kubernetes.
"""

from __future__ import annotations

import re
from typing import Any

K8S_CONFIG_TAG = "dagster-k8s/config"  # the tag dagster-k8s reads (dagster_k8s.job.USER_DEFINED_K8S_CONFIG_KEY)
GPU_RESOURCE = "nvidia.com/gpu"

# Labelled by NVIDIA GPU feature discovery on every GPU node; the Spark `k8s` profile selects it too.
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
# GPU nodes are usually tainted so that CPU-only pods stay off them.
GPU_TOLERATIONS = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]

# Run queue tags: deploy/dagster.yaml and deploy/helm/values.yaml limit runs by these.
RUN_QUEUE_TAG = "dgx/queue"
TRAINING_RUN_TAGS = {RUN_QUEUE_TAG: "gpu-training"}  # one at a time, in submission order
INTERACTIVE_RUN_TAGS = {RUN_QUEUE_TAG: "interactive"}  # a bounded share beside training

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


def gpu_step_tags(gpus: int = 1, cpu: str = "8", memory: str = "64Gi") -> dict[str, Any]:
    """`op_tags` for a step that needs `gpus` whole GPUs, `cpu` cores and `memory` in its own pod.

    Extended resources such as GPUs go in limits only (Kubernetes sets the request equal); CPU and
    memory get equal requests and limits so the pod is Guaranteed and never evicted mid-training.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a whole number of GPUs >= 1, got {gpus!r}")
    for name, quantity in (("cpu", cpu), ("memory", memory)):
        if not _QUANTITY.match(str(quantity)):
            raise ValueError(f"{name}={quantity!r} is not a Kubernetes quantity (e.g. '8', '500m', '64Gi')")
    return {
        K8S_CONFIG_TAG: {
            "container_config": {
                "resources": {
                    "requests": {"cpu": str(cpu), "memory": str(memory)},
                    "limits": {"cpu": str(cpu), "memory": str(memory), GPU_RESOURCE: str(gpus)},
                },
            },
            "pod_spec_config": {
                "node_selector": dict(GPU_NODE_SELECTOR),
                "tolerations": [dict(toleration) for toleration in GPU_TOLERATIONS],
            },
        }
    }
