"""The landing sensor after a real Spark ingest: what was materialized from the same content is not requested again."""

import json

import dagster as dg
from support.sensor_ticks import land, tick

from dgx_assets.defs.resources import LakeResource
from dgx_assets.partitions import image_batches


def test_batches_already_materialized_from_the_same_content_are_not_requested_again(tmp_path, spark_resource):
    """`make demo` materializes raw_images itself; a sensor turned on afterwards must not ingest it all again."""
    from dgx_assets.defs.ingest.assets import raw_images

    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    land(landing, "b1")
    land(landing, "b2")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["b1", "b2"])
        for batch in ("b1", "b2"):
            assert dg.materialize(
                [raw_images],
                instance=instance,
                partition_key=batch,
                resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
            ).success
        first = tick(instance, lake_root, None)
        assert first.run_requests == []
        assert "already ingested from the same content: b1, b2" in first.skip_reason.skip_message
        assert json.loads(first.cursor)["requested"].keys() == {"b1", "b2"}
        assert tick(instance, lake_root, first.cursor).run_requests == []
        land(landing, "b2", names=("a.png", "b.png", "c.png"))  # new content: ingested again once it settles
        second = tick(instance, lake_root, tick(instance, lake_root, first.cursor).cursor)
        assert [request.partition_key for request in second.run_requests] == ["b2"]
