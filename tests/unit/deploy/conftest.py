"""Fixtures over the files under deploy/."""

from __future__ import annotations

import tomllib

import pytest
import yaml
from support.deploy_files import DEPLOY, REPO, find


@pytest.fixture(scope="session")
def project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="session")
def helm_values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


@pytest.fixture(scope="session")
def dagster_yaml() -> dict:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


@pytest.fixture(scope="session")
def env_configmap() -> dict:
    return find("ConfigMap", "dgx-assets-env")["data"]
