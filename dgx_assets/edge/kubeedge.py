"""The KubeEdge rollout of a registered model version: a Deployment for the edge nodes, as plain dicts.

``edge_deployment`` pins one exact registered version (never an alias, so a later promotion does not
change running devices behind the operator's back): an init container fetches that version's TFLite
model from the MLflow registry (``dgx-assets edge-fetch``), the runtime container serves it with LiteRT
(``dgx-assets edge-run --serve``). Pods land only on KubeEdge edge nodes (the ``node-role.kubernetes.io/edge``
label keadm puts on them, and the taint edge nodes often carry), run as a non-root user with a read-only
root file system and bounded CPU and memory, as inspection stations are small machines.
"""

from __future__ import annotations

from typing import Any

import yaml

EDGE_ROLE_LABEL = "node-role.kubernetes.io/edge"
EDGE_IMAGE = "dgx-assets/edge-runtime:0.1.0"
EDGE_APP = "defect-classifier-edge"
EDGE_USER = 10001  # the edge runtime image's user
DEFAULT_TRACKING_URI = "http://mlflow.dgx-assets.svc.cluster.local:5000"
MODEL_DIR = "/models/current"


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def edge_deployment(
    model_name: str,
    version: str,
    *,
    namespace: str = "dgx-assets",
    image: str = EDGE_IMAGE,
    tracking_uri: str = DEFAULT_TRACKING_URI,
    replicas: int = 1,
    port: int = 8500,
    cpu: str = "1",
    memory: str = "512Mi",
    threads: int = 1,
) -> dict[str, Any]:
    """The Deployment of ``model_name`` version ``version`` on KubeEdge edge nodes."""
    if not str(version).isdigit():
        raise ValueError(f"pin a registered version number, not {version!r} (aliases move; devices must not)")
    version = str(version)
    labels = {"app.kubernetes.io/name": EDGE_APP, "app.kubernetes.io/part-of": "dgx-assets", "dgx-assets/model-version": version}
    resources = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": cpu, "memory": memory}}
    mounts = [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]
    probe = {"httpGet": {"path": "/healthz", "port": "http"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": EDGE_APP,
            "namespace": namespace,
            "labels": labels,
            "annotations": {"dgx-assets/registered-model": f"{model_name}/{version}"},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": EDGE_APP}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": EDGE_USER,
                        "runAsGroup": EDGE_USER,
                        "fsGroup": EDGE_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "nodeSelector": {EDGE_ROLE_LABEL: ""},
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [{"key": EDGE_ROLE_LABEL, "operator": "Exists"}]}]
                            }
                        }
                    },
                    "tolerations": [{"key": EDGE_ROLE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                    "initContainers": [
                        {
                            "name": "fetch-model",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["dgx-assets", "edge-fetch"],
                            "args": ["--model-name", model_name, "--version", version, "--out", MODEL_DIR],
                            "env": [
                                {"name": "MLFLOW_TRACKING_URI", "value": tracking_uri},
                                {"name": "MLFLOW_DISABLE_TELEMETRY", "value": "true"},
                            ],
                            "resources": resources,
                            "securityContext": _container_security(),
                            "volumeMounts": mounts,
                        }
                    ],
                    "containers": [
                        {
                            "name": "edge-runtime",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["dgx-assets", "edge-run"],
                            # 0.0.0.0 inside the pod: edgecore's probes and local clients reach it on the pod IP.
                            "args": [
                                "--model-dir",
                                MODEL_DIR,
                                "--serve",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                str(port),
                                "--threads",
                                str(threads),
                            ],
                            "ports": [{"name": "http", "containerPort": port}],
                            "resources": resources,
                            "readinessProbe": probe | {"periodSeconds": 10},
                            "livenessProbe": probe | {"periodSeconds": 20, "failureThreshold": 3},
                            "securityContext": _container_security(),
                            "volumeMounts": [
                                {"name": "models", "mountPath": "/models", "readOnly": True},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "models", "emptyDir": {"sizeLimit": "256Mi"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }


def render(deployment: dict[str, Any]) -> str:
    version = deployment["metadata"]["annotations"]["dgx-assets/registered-model"]
    header = f"# Generated by `dgx-assets edge-manifest` for {version}; apply with\n#   kubectl apply -f edge-deployment.yaml\n"
    return header + yaml.safe_dump(deployment, sort_keys=False)


def champion_version(tracking_uri: str, model_name: str, alias: str = "champion") -> str:
    """The version number the alias points at now, with a clear error when there is none."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return str(MlflowClient(tracking_uri).get_model_version_by_alias(model_name, alias).version)
    except MlflowException as error:
        raise ValueError(
            f"registered model {model_name!r} has no {alias!r} version at {tracking_uri}: promote one "
            "(champion_model) or pass --version"
        ) from error
