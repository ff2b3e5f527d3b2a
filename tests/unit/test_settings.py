"""Every environment variable is a field of one model (settings.Environment), read when asked, never at import;
the resources and the MLflow settings take their defaults from there; a bad value is refused naming the variable;
the executor and Spark follow one deployment; the process defaults never override what the environment says."""

import os
import re
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from dgx_assets import settings
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.tracking.store import TrackingConfigError, check_tracking_uri

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
VARIABLES = {name: field.validation_alias for name, field in settings.Environment.model_fields.items()}


def _defaults(state: Path) -> dict[str, object]:
    lake = str(state / "lake")
    return {
        "state_dir": state,
        "lake_root": lake,
        "landing_uri": f"{lake}/landing",
        "prompts_uri": f"{lake}/prompts/prompts.csv",
        "catalog_uri": f"sqlite:///{state / 'lake' / 'iceberg_catalog.db'}",
        "catalog_warehouse": f"{lake}/warehouse",
        "mlflow_tracking_uri": f"sqlite:///{state / 'mlflow.db'}",
        "deployment": "local",
        "spark_master": None,
        "spark_event_log": "file:///tmp/spark-events",
        "k8s_namespace": "dgx-assets",
        "spark_image": "dgx-assets/code-location:0.1.0",
        "pod_ip": "127.0.0.1",
        "mlflow_ui_url": "http://127.0.0.1:5000",
        "dagster_ui_url": "http://127.0.0.1:3000",
        "docs_url": "http://127.0.0.1:3001",
        "ernie_endpoints": "local",
        "ernie_token": None,
        "retrain_cron": "0 2 * * *",
        "retrain_timezone": "UTC",
        "retrain_min_interval_s": 21600.0,
        "git_commit": None,
    }


@pytest.fixture
def bare(monkeypatch, _state_dir):
    """No variable set but conftest's DGX_STATE_DIR."""
    for variable in VARIABLES.values():
        if variable != "DGX_STATE_DIR":
            monkeypatch.delenv(str(variable), raising=False)
    return _state_dir


def test_every_field_has_its_documented_default(bare):
    env = settings.environment()
    assert env.model_dump() == _defaults(bare)
    assert set(_defaults(bare)) == set(VARIABLES)  # a new field gets a default here
    assert env.retrain_schedule == ("0 2 * * *", "UTC") and env.token is None


# One value per variable, as the environment spells it, and what the field holds then.
GIVEN = {
    "DGX_STATE_DIR": ("/srv/dgx", Path("/srv/dgx")),
    "DGX_LAKE_ROOT": ("hdfs://nn:8020/lake", "hdfs://nn:8020/lake"),
    "DGX_LANDING_URI": ("hdfs://nn:8020/in", "hdfs://nn:8020/in"),
    "DGX_PROMPTS_URI": ("file:///p.csv", "file:///p.csv"),
    "DGX_CATALOG_URI": ("thrift://metastore:9083", "thrift://metastore:9083"),
    "DGX_CATALOG_WAREHOUSE": ("hdfs://nn:8020/w", "hdfs://nn:8020/w"),
    "MLFLOW_TRACKING_URI": ("http://mlflow:5000", "http://mlflow:5000"),
    "DGX_DEPLOYMENT": ("standalone", "standalone"),
    "DGX_SPARK_MASTER": ("spark://dgx-01:7077", "spark://dgx-01:7077"),
    "DGX_SPARK_EVENT_LOG": ("hdfs://nn:8020/spark-events", "hdfs://nn:8020/spark-events"),
    "DGX_K8S_NAMESPACE": ("ml", "ml"),
    "DGX_SPARK_IMAGE": ("registry/dgx:1", "registry/dgx:1"),
    "POD_IP": ("10.1.2.3", "10.1.2.3"),
    "DGX_MLFLOW_UI_URL": ("http://mlflow.example/", "http://mlflow.example"),
    "DGX_DAGSTER_UI_URL": ("http://dagster.example/", "http://dagster.example"),
    "DGX_DOCS_URL": ("http://docs.example:8080/", "http://docs.example:8080"),
    "DGX_ERNIE_ENDPOINTS": (" http://a:9998,http://b:9998 ", "http://a:9998,http://b:9998"),
    "DGX_ERNIE_TOKEN": ("t0ken", "t0ken"),
    "DGX_RETRAIN_CRON": ("*/5 * * * *", "*/5 * * * *"),
    "DGX_RETRAIN_TIMEZONE": ("Europe/Berlin", "Europe/Berlin"),
    "DGX_RETRAIN_MIN_INTERVAL_S": ("600", 600.0),
    "DGX_GIT_COMMIT": ("abc123", "abc123"),
}


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_field_follows_its_variable_when_asked(bare, monkeypatch, name):
    variable = str(VARIABLES[name])
    raw, expected = GIVEN[variable]
    before = settings.environment()
    monkeypatch.setenv(variable, raw)
    value = getattr(settings.environment(), name)
    assert (value.get_secret_value() if name == "ernie_token" else value) == expected
    assert getattr(before, name) == _defaults(bare)[name]  # read when asked: the earlier reading keeps its value
    monkeypatch.setenv(variable, "")
    unset = _defaults(settings.repo_root() / ".dgx" if name == "state_dir" else bare)[name]
    assert getattr(settings.environment(), name) == unset  # empty is unset


def test_what_follows_the_lake_follows_it(bare, monkeypatch):
    monkeypatch.setenv("DGX_LAKE_ROOT", "hdfs://nn:8020/lake/")
    env = settings.environment()
    assert (env.landing_uri, env.prompts_uri) == ("hdfs://nn:8020/lake/landing", "hdfs://nn:8020/lake/prompts/prompts.csv")
    assert env.catalog_uri == f"sqlite:///{bare / 'iceberg_catalog.db'}"  # a remote lake: the catalog under the state
    assert env.catalog_warehouse == "hdfs://nn:8020/lake/warehouse"
    assert LakeResource(root=str(bare)).landing_uri == f"{bare.as_uri()}/landing"  # a resource's own root first
    monkeypatch.setenv("DGX_LANDING_URI", "file:///in")
    local = settings.environment().with_lake("/data/lake")
    assert local.landing_uri == "file:///in"  # set by the environment: kept
    assert (
        local.catalog_uri == "sqlite:////data/lake/iceberg_catalog.db" and local.prompts_uri == "/data/lake/prompts/prompts.csv"
    )
    monkeypatch.setenv("DGX_LAKE_ROOT", str(bare))  # a local lake: opening an hdfs:// one needs a JVM
    assert LakeResource(root=str(bare)).landing_uri == "file:///in"  # the environment's own landing first


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("DGX_DEPLOYMENT", "yarn", "Input should be 'local', 'standalone' or 'k8s'"),
        ("DGX_RETRAIN_TIMEZONE", "Mars/Olympus", "'Mars/Olympus' is not an IANA time zone"),
        ("DGX_RETRAIN_CRON", "nightly", "'nightly' is not a cron expression of five fields"),
        ("DGX_DOCS_URL", "/", "is empty"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(bare, monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=re.escape(words)) as error:
        settings.environment()
    assert [entry["loc"] for entry in error.value.errors()] == [(variable,)]
    assert str(error.value).splitlines()[1] == variable


def test_the_token_is_never_shown(bare, monkeypatch):
    monkeypatch.setenv("DGX_ERNIE_TOKEN", "t0ken")
    env = settings.environment()
    assert env.token == "t0ken" and "t0ken" not in repr(env) and "t0ken" not in str(env.model_dump())


def test_the_executor_and_spark_follow_one_deployment(bare, monkeypatch):
    from dagster_k8s import k8s_job_executor

    from dgx_assets.definitions import defs as code_location

    assert "deployment" not in SparkResource.model_fields  # no second place to set it
    monkeypatch.setenv("DGX_DEPLOYMENT", "k8s")
    monkeypatch.setenv("DGX_SPARK_MASTER", "k8s://https://kubernetes.default.svc:443")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    defs = code_location()
    assert defs.executor is k8s_job_executor
    conf = (defs.resources or {})["spark"].spark_config
    assert conf["spark.master"].startswith("k8s://") and conf["spark.driver.host"] == "10.1.2.3"
    monkeypatch.setenv("DGX_DEPLOYMENT", "local")
    defs = code_location()
    assert defs.executor is not k8s_job_executor
    assert (defs.resources or {})["spark"].spark_config["spark.driver.host"] == "127.0.0.1"


def test_the_architecture_table_lists_every_variable():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = [variable for variable in VARIABLES.values() if f"| `{variable}`" not in text]
    assert not missing, f"docs/architecture.md's environment table lacks {missing}"


def test_process_defaults_fill_gaps_but_keep_what_the_environment_says(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.7")
    monkeypatch.delenv("GX_ANALYTICS_ENABLED", raising=False)
    settings.apply_process_defaults()
    assert os.environ["SPARK_LOCAL_IP"] == "10.0.0.7"
    assert os.environ["GX_ANALYTICS_ENABLED"] == "false" and os.environ["PYSPARK_PYTHON"]
    assert settings.process_defaults()["PYSPARK_PYTHON"] == sys.executable


def test_the_mlflow_resource_builds_the_tracking_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("DGX_DAGSTER_UI_URL", "http://dagster.example/")
    monkeypatch.delenv("DGX_MLFLOW_UI_URL", raising=False)
    tracking = MlflowResource().tracking_config()
    assert (tracking.tracking_uri, tracking.experiment_name, tracking.registered_model_name) == (
        "http://mlflow:5000",
        "dgx_assets",
        "dgx_defect_classifier",
    )
    assert tracking.dagster_ui_url == "http://dagster.example" and tracking.ui_url == "http://127.0.0.1:5000"
    assert MlflowResource().tracking_config("dgx_defect_challenger").registered_model_name == "dgx_defect_challenger"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("", "no MLflow tracking URI configured"),
        ("sqlite:///:memory:", "is not a sqlite file URI"),
        ("ftp://mlflow/", "unsupported MLflow tracking URI scheme 'ftp'"),
    ],
)
def test_a_tracking_uri_that_cannot_work_is_refused_with_the_setting_to_fix(uri, words):
    with pytest.raises(TrackingConfigError, match=words) as error:
        check_tracking_uri(uri)
    assert "MLFLOW_TRACKING_URI" in str(error.value)


def test_a_sqlite_store_in_a_folder_that_cannot_be_made_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(TrackingConfigError, match="cannot create"):
        check_tracking_uri(f"sqlite:///{blocker}/sub/mlflow.db")
    check_tracking_uri(f"sqlite:///{tmp_path}/ok/mlflow.db")  # a folder it can make: fine
    assert (tmp_path / "ok").is_dir()
