"""Loaders for the files under deploy/, shared by the deploy tests (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
OUR_IMAGES = {"code-location", "serving"}  # the Dockerfiles this repository builds
DEPLOY = REPO / "deploy"
K8S_DIR = DEPLOY / "k8s"

WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_documents() -> list[tuple[str, dict]]:
    """(file name, document) for every Kubernetes object in deploy/k8s."""
    return [(path.name, doc) for path in sorted(K8S_DIR.glob("*.yaml")) for doc in load_documents(path)]


def workloads() -> list[dict]:
    return [doc for _, doc in manifest_documents() if doc["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def find(kind: str, name: str) -> dict:
    matches = [doc for _, doc in manifest_documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(matches)}"
    return matches[0]


def container_args(container: dict) -> dict[str, str]:
    """`--name=value` arguments as a dict (the manifests always use the `=` form)."""
    parsed = {}
    for arg in container.get("args", []):
        name, _, value = arg.partition("=")
        parsed[name] = value
    return parsed


def dockerfile(name: str) -> str:
    return (DEPLOY / "docker" / f"{name}.Dockerfile").read_text()
