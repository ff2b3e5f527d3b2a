"""Spark runs one after another in one process (as `dg.materialize`, a notebook or the in-process executor
runs them), each on a session of its own: the lake's Python data source is registered with every session."""

import gc

import dagster as dg
import pytest
from imagefactory import write_batch
from support.lake_tables import read_rows

from dgx_assets.defs.generation.assets import ernie_generated_images
from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.ingest.assets import raw_images
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.generation.prompts import write_demo_prompts
from dgx_assets.partitions import image_batches

FAST_CLIENT = dict(backoff_s=0.05, max_retries=1, breaker_cooldown_s=30.0)


def stop_the_session() -> None:
    """End the run's session as a notebook's `spark.stop()` does; the next run's resource starts a new one."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    del session
    gc.collect()  # the stopped session's Python object goes: a new one may be given its address (its id())


def ingest(instance, spark_conf: dict, lake_root, batch: str) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions(image_batches.name, [batch])
    return dg.materialize(
        [raw_images],
        instance=instance,
        partition_key=batch,
        resources={"spark": SparkResource(spark_conf=spark_conf), "lake": LakeResource(root=str(lake_root))},
    )


@pytest.fixture
def spark_conf(spark_resource):
    """The tests' Spark settings; each run gets a SparkResource of its own with them."""
    yield dict(spark_resource.spark_conf)
    stop_the_session()


def test_runs_of_different_spark_assets_on_new_sessions_each_write_their_table(tmp_path, spark_conf, dead_url, monkeypatch):
    # CPython may give a new session the address, so the id(), of the stopped one before it; whether it does
    # depends on what else was allocated. Here every session has the same id(), as if it always did.
    from dgx_assets.spark import table_writer

    monkeypatch.setattr(table_writer, "id", lambda _: 0, raising=False)
    lake_root = tmp_path / "lake"
    write_batch(lake_root / "landing", "b1", bad=False)
    write_batch(lake_root / "landing", "b2", bad=False)
    prompts = write_demo_prompts(str(tmp_path / "prompts.csv"), width=32, height=32)
    with dg.instance_for_test() as instance:
        assert ingest(instance, spark_conf, lake_root, "b1").success
        stop_the_session()

        # ernie_generated_images on a second session: no endpoint answers, so the step fails, but only after
        # every prompt's row, with its reason, is committed (a write that cannot find the data source loses them).
        result = dg.materialize(
            [ernie_generated_images],
            instance=instance,
            resources={
                "spark": SparkResource(spark_conf=spark_conf),
                "lake": LakeResource(root=str(lake_root), prompts=prompts),
                "ernie": ErnieServingResource(endpoints=dead_url, **FAST_CLIENT),
            },
            raise_on_error=False,
        )
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        message = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
        assert "DATA_SOURCE_NOT_FOUND" not in message
        assert "No image could be generated for any of the 12 prompts" in message
        rows = read_rows(lake_root, "ernie_generated_images")
        assert len(rows) == 12 and {row["status"] for row in rows} == {"failed"}
        stop_the_session()

        assert ingest(instance, spark_conf, lake_root, "b2").success  # and a third session
    assert {row["path"].split("/")[-3] for row in read_rows(lake_root, "raw_images", "b1")} == {"b1"}
    assert read_rows(lake_root, "raw_images", "b2")
