"""Test-wide setup: every test writes under a temporary state dir, Spark stays on loopback.

Two tiers, by folder: tests/unit starts no JVM, no server and no subprocess (`make test-unit`, under a
minute); tests/integration runs against real Spark, Dagster, MLflow, servers and subprocesses. Each test is
marked with its tier (`-m unit` / `-m integration`). tests/browser is the browser check (`make e2e`).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for tests/imagefactory.py

from dgx_assets import settings

os.environ.update(settings.process_defaults())  # the project's own, not whatever the shell has
for variable in (
    "DGX_LAKE_ROOT",
    "DGX_LANDING_URI",
    "DGX_PROMPTS_URI",
    "DGX_DEPLOYMENT",
    "DGX_SPARK_MASTER",
    "MLFLOW_TRACKING_URI",
    "DGX_ERNIE_ENDPOINTS",
):
    os.environ.pop(variable, None)

# Small, quiet Spark for tests: the UI and event log cost start-up time and ports.
TEST_SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "2g",
}


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    """Each test gets its own `.dgx` (lake, GE context, MLflow store)."""
    state = tmp_path / "dgx"
    state.mkdir()
    monkeypatch.setenv("DGX_STATE_DIR", str(state))
    return state


@pytest.fixture
def spark_resource():
    from dgx_assets.spark.resource import SparkResource

    return SparkResource(spark_conf=TEST_SPARK_CONF)


@pytest.fixture
def started_spark(spark_resource):
    """The SparkSession of `spark_resource`, set up as Dagster sets it up for a run."""
    import dagster as dg

    with dg.build_init_resource_context() as init:
        spark_resource.setup_for_execution(init)
    return spark_resource.spark_session


@pytest.fixture(scope="session")
def one_paddle_thread():
    """Serving processes started while this is active use one thread each: their pools only fight on 2 cores."""
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    if previous is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = previous


@pytest.fixture(scope="session")
def quick_model(one_paddle_thread):
    """A quick generator, built once per version of the generator's code (cached under <repo>/.dgx/cache)."""
    from bench.quick_generator import cached_quick_generator

    return cached_quick_generator()


def pytest_collection_modifyitems(items):
    tests = Path(__file__).parent
    for item in items:
        tier = item.path.relative_to(tests).parts[0]
        if tier in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, tier))
