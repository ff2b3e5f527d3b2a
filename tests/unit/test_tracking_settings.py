"""The `mlflow` resource's settings: declared once (tracking/store.py), resolved against the environment when a
run asks for them."""

from dgx_assets.defs.resources import MlflowResource
from dgx_assets.tracking.store import DEFAULT_EXPERIMENT, TrackingConfig, TrackingSettings


def test_the_resource_shows_the_tracking_settings_as_declared():
    assert issubclass(MlflowResource, TrackingSettings) and issubclass(TrackingConfig, TrackingSettings)
    fields = MlflowResource.model_fields
    for name, field in TrackingSettings.model_fields.items():
        assert fields[name].description == field.description and fields[name].default == field.default


def test_a_run_gets_every_default_filled_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    monkeypatch.setenv("DGX_MLFLOW_UI_URL", "http://mlflow.example:5000/")
    resolved = MlflowResource().tracking_config()
    assert resolved.tracking_uri == f"sqlite:///{tmp_path}/m.db"
    assert resolved.ui_url == "http://mlflow.example:5000"
    assert resolved.experiment_name == DEFAULT_EXPERIMENT
    assert MlflowResource(tracking_uri="sqlite:///x.db").tracking_config("other").registered_model_name == "other"
