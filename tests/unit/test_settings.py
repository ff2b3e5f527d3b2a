"""Every environment variable is read in settings.py when asked, never at import; the resources and the MLflow
settings take their defaults from there; the process defaults never override what the environment says."""

import os
import sys

import pytest

from dgx_assets import settings
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.tracking.store import TrackingConfigError, check_tracking_uri


def test_locations_follow_the_environment_when_asked(monkeypatch, tmp_path):
    assert settings.lake_root() == str(tmp_path / "dgx" / "lake")  # conftest's DGX_STATE_DIR
    monkeypatch.setenv("DGX_LAKE_ROOT", "hdfs://nn:8020/lake")
    assert settings.landing_uri() == "hdfs://nn:8020/lake/landing"
    assert settings.prompts_uri() == "hdfs://nn:8020/lake/prompts/prompts.csv"
    assert LakeResource(root=str(tmp_path)).landing_uri == f"{tmp_path.as_uri()}/landing"  # its own root first
    monkeypatch.setenv("DGX_DEPLOYMENT", "yarn")
    with pytest.raises(ValueError, match="DGX_DEPLOYMENT='yarn' is not one of local, standalone, k8s"):
        settings.deployment()


def test_optional_settings_have_their_documented_defaults(monkeypatch):
    for name in ("DGX_RETRAIN_CRON", "DGX_RETRAIN_TIMEZONE", "DGX_GIT_COMMIT", "DGX_ERNIE_TOKEN", "POD_IP"):
        monkeypatch.delenv(name, raising=False)
    assert settings.retrain_schedule() == ("0 2 * * *", "UTC")
    assert settings.git_commit() is None and settings.ernie_token() is None and settings.pod_ip() == "127.0.0.1"
    monkeypatch.setenv("DGX_RETRAIN_CRON", "*/5 * * * *")
    monkeypatch.setenv("DGX_GIT_COMMIT", "abc123")
    assert settings.retrain_schedule() == ("*/5 * * * *", "UTC") and settings.git_commit() == "abc123"


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
