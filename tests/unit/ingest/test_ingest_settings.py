"""raw_images' settings: declared once (ingest/images.py), shown as they are in the launchpad, and a wrong one
fails the run with a message that names it, before Spark is touched."""

import re

import dagster as dg
import pytest
from pydantic import ValidationError

from dgx_assets.defs.ingest.assets import RawImagesConfig, raw_images
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.ingest.images import IngestSettings, ValidationLimits, inspect_image


def test_the_dagster_config_is_the_ingest_settings_and_adds_nothing():
    assert issubclass(RawImagesConfig, IngestSettings) and issubclass(IngestSettings, ValidationLimits)
    schema = raw_images.op.config_schema.config_type.fields
    assert set(schema) == {"max_pixels", "max_side", "max_file_bytes", "validation_share", "test_share", "target_file_mb"}
    for name, field in IngestSettings.model_fields.items():
        assert schema[name].description == field.description
    plain = RawImagesConfig(max_file_bytes=1000, test_share=0.2).ingest_settings()
    assert type(plain) is IngestSettings and plain == IngestSettings(max_file_bytes=1000, test_share=0.2)
    assert plain.target_file_bytes == 128 * 1024 * 1024


def test_the_settings_are_the_limits_an_image_is_judged_by():
    verdict = inspect_image(b"\x89PNG\r\n\x1a\n" + b"\0" * 2000, "big.png", IngestSettings(max_file_bytes=1000))
    assert verdict.status == "too_large"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_pixels": 0}, "max_pixels"),
        ({"max_side": -1}, "max_side"),
        ({"max_file_bytes": 0}, "max_file_bytes"),
        ({"validation_share": -0.1}, "validation_share"),
        ({"test_share": 1.0}, "test_share"),
        ({"validation_share": 0.5, "test_share": 0.5}, "validation_share (0.5) + test_share (0.5)"),
        ({"target_file_mb": 0}, "target_file_mb"),
    ],
)
def test_a_wrong_setting_is_named(settings, named):
    with pytest.raises(ValidationError, match=re.escape(named)):
        IngestSettings(**settings)


def test_a_wrong_setting_fails_the_run_naming_it_before_spark_starts(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("image_batches", ["b1"])
    result = dg.materialize(
        [raw_images],
        partition_key="b1",
        resources={"spark": SparkResource(), "lake": LakeResource(root=str(tmp_path / "lake"))},
        run_config=dg.RunConfig({"raw_images": {"config": {"validation_share": 0.6, "test_share": 0.6}}}),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "validation_share (0.6) + test_share (0.6) must be below 1" in str(failure.step_failure_data.error)
