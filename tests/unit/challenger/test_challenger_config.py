"""challenger_model's settings: declared once (challenger/config.py); the Dagster config adds only the registry
name, and a wrong setting fails the run with a message that names it, before Spark or the data are touched."""

import dagster as dg
import pytest
from pydantic import ValidationError

from dgx_assets.challenger.config import ChallengerConfig
from dgx_assets.defs.model.challenger import ChallengerModelConfig, challenger_model
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource


def test_the_dagster_config_is_the_challenger_config_plus_the_registry_name():
    assert issubclass(ChallengerModelConfig, ChallengerConfig)
    assert ChallengerModelConfig.model_fields.keys() - ChallengerConfig.model_fields.keys() == {"registered_model_name"}
    schema = challenger_model.op.config_schema.config_type.fields
    # The fields users set today are all still there (latency_images joins them, from the one declaration).
    assert {
        "registered_model_name", "max_depth", "n_estimators", "learning_rate", "subsample", "colsample_bytree",
        "early_stopping_rounds", "num_workers", "device", "seed",
    } <= set(schema)  # fmt: skip
    for name, field in ChallengerConfig.model_fields.items():
        assert schema[name].description == field.description
    asked = ChallengerModelConfig(registered_model_name="other", max_depth=6, device="cpu")
    assert asked.challenger_config() == ChallengerConfig(max_depth=6, device="cpu")


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_depth": 0}, "max_depth"),
        ({"n_estimators": 0}, "n_estimators"),
        ({"early_stopping_rounds": 0}, "early_stopping_rounds"),
        ({"latency_images": 0}, "latency_images"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"subsample": 1.5}, "subsample"),
        ({"colsample_bytree": -0.1}, "colsample_bytree"),
        ({"num_workers": 0}, "num_workers"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_a_wrong_setting_is_named(settings, named):
    with pytest.raises(ValidationError, match=named):
        ChallengerConfig(**settings)


def test_the_defaults_pass():
    assert ChallengerConfig().device == "auto"


def _materialize(tmp_path, config: dict) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [challenger_model],
        resources={
            "spark": SparkResource(),
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        },
        run_config=dg.RunConfig({"challenger_model": {"config": config}}),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_a_wrong_choice_is_refused_with_the_run_config_and_a_wrong_bound_fails_the_step_naming_it(tmp_path):
    # A choice is an enum in the launchpad: Dagster refuses the run before it starts.
    with pytest.raises(dg.DagsterInvalidConfigError, match=r"config:device not in enum type"):
        _materialize(tmp_path, {"device": "tpu"})
    # A bound is checked when the step builds its config: before Spark or the data are touched.
    result = _materialize(tmp_path, {"max_depth": 0})
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "max_depth" in failure.step_failure_data.error.cause.message
    assert "greater than or equal to 1" in failure.step_failure_data.error.cause.message
    assert not (tmp_path / "lake").exists()
