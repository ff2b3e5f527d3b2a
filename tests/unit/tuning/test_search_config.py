"""hyperparameter_search's settings: declared once (tuning/config.py) with their bounds, shown as they are in the
launchpad, and a wrong one fails the run with a message that names it, before Ray or Spark is touched."""

import dagster as dg
import pytest
from pydantic import ValidationError

from dgx_assets.defs.model.search import HyperparameterSearchConfig, hyperparameter_search
from dgx_assets.defs.resources import LakeResource, MlflowResource, SparkResource
from dgx_assets.tuning.config import SearchConfig


def test_the_dagster_config_is_the_search_config_and_adds_nothing():
    assert issubclass(HyperparameterSearchConfig, SearchConfig)
    assert HyperparameterSearchConfig.model_fields.keys() == SearchConfig.model_fields.keys()
    # The launchpad's field names and descriptions are the ones users set today.
    schema = hyperparameter_search.op.config_schema.config_type.fields
    assert set(schema) == {
        "num_samples", "max_epochs", "grace_period", "reduction_factor", "learning_rate_min",
        "learning_rate_max", "dropout_max", "batch_sizes", "ray_worker_nodes", "seed",
    }  # fmt: skip
    for name, field in SearchConfig.model_fields.items():
        assert schema[name].description == field.description
    search = HyperparameterSearchConfig(num_samples=4, batch_sizes=[8, 16]).search_config()
    assert type(search) is SearchConfig and search == SearchConfig(num_samples=4, batch_sizes=[8, 16])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"num_samples": 0}, "num_samples"),
        ({"max_epochs": 0, "grace_period": 0}, "max_epochs"),
        ({"grace_period": 30}, "grace_period"),
        ({"reduction_factor": 1}, "reduction_factor"),
        ({"learning_rate_min": 0.1, "learning_rate_max": 0.01}, "learning_rate_min"),
        ({"dropout_max": 1.0}, "dropout_max"),
        ({"batch_sizes": []}, "batch_sizes"),
        ({"batch_sizes": [16, 0]}, "batch_sizes"),
        ({"ray_worker_nodes": 0}, "ray_worker_nodes"),
    ],
)
def test_a_wrong_setting_is_named(settings, named):
    with pytest.raises(ValidationError, match=named):
        SearchConfig(**settings)


def test_the_defaults_pass():
    assert SearchConfig().grace_period <= SearchConfig().max_epochs


def test_a_wrong_setting_fails_the_run_naming_it_before_ray_or_spark_start(tmp_path):
    result = dg.materialize(
        [hyperparameter_search],
        resources={
            "spark": SparkResource(),
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        },
        run_config=dg.RunConfig({"hyperparameter_search": {"config": {"dropout_max": 1.5}}}),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "dropout_max" in failure.step_failure_data.error.cause.message
