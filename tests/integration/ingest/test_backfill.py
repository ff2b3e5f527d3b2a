"""A backfill of many landing batches: one run (up to MAX_BATCHES_PER_RUN batches) and one SparkSession for
raw_images and image_features, each batch committed on its own and reported as its own partition."""

import dagster as dg
import pytest
from imagefactory import write_batch
from support.backfill_tags import RANGE_END, RANGE_START

from dgx_assets.defs.ingest.assets import LANDING_FINGERPRINT, raw_images
from dgx_assets.defs.ingest.features import image_features
from dgx_assets.defs.ingest.sensors import _ingested_fingerprint
from dgx_assets.defs.resources import LakeResource
from dgx_assets.lake.store import Lake
from dgx_assets.partitions import MAX_BATCHES_PER_RUN, PER_BATCH, image_batches

BATCHES = [f"b{i:02d}" for i in range(10)]
FEATURES = {"image_height": 32, "image_width": 32, "embedding": "none"}


def backfill(instance, spark_resource, lake_root, keys, raise_on_error=True):
    """What a Dagster backfill launches for these keys under the assets' policy: one run over the key range."""
    return dg.materialize(
        [raw_images, image_features],
        instance=instance,
        resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
        tags={RANGE_START: keys[0], RANGE_END: keys[-1]},  # as a backfill tags it
        run_config={"ops": {"image_features": {"config": FEATURES}}},
        raise_on_error=raise_on_error,
    )


def test_the_assets_declare_a_bounded_multi_run_backfill_policy():
    for asset in (raw_images, image_features):
        assert asset.backfill_policy == dg.BackfillPolicy.multi_run(MAX_BATCHES_PER_RUN)
    assert MAX_BATCHES_PER_RUN >= len(BATCHES)


@pytest.mark.timeout(300)
def test_a_ten_batch_backfill_is_one_run_with_one_materialization_per_batch(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    for seed, batch in enumerate(BATCHES):
        write_batch(lake_root / "landing", batch, seed=seed, bad=False)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, BATCHES)
        result = backfill(instance, spark_resource, lake_root, BATCHES)

        assert result.success
        assert len(instance.get_runs()) == 1  # ten batches, one run, one SparkSession
        lake = Lake(str(lake_root))
        for asset in ("raw_images", "image_features"):
            events = result.asset_materializations_for_node(asset)
            own = [e for e in events if "path" in e.metadata]  # each batch's own report, made on its commit
            assert sorted(e.partition for e in own) == BATCHES
            assert set(lake.tables.partitions(asset)) == set(BATCHES)
            for event in own:  # each batch its own commit: the snapshot it recorded holds its rows
                batch = lake.tables.snapshot(asset, int(event.metadata["snapshot_id"].value), event.partition)
                assert event.metadata["dagster/row_count"].value == batch.dataset().count_rows() > 0
            summary = [e for e in events if PER_BATCH in e.metadata]
            assert sorted(e.partition for e in summary) == BATCHES  # the run's table, recorded last per partition
        # The landing sensor still finds what each batch was ingested from, through the run's summary.
        for event in result.asset_materializations_for_node("raw_images"):
            if "path" in event.metadata:
                assert _ingested_fingerprint(instance, event.partition) == event.metadata[LANDING_FINGERPRINT].value


@pytest.mark.timeout(300)
def test_a_failing_batch_keeps_the_batches_committed_before_it(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    keys = ["c0", "c1", "c2"]
    write_batch(lake_root / "landing", "c0", bad=False)
    (lake_root / "landing" / "c1").mkdir(parents=True)  # no images: raw_images refuses this batch
    write_batch(lake_root / "landing", "c2", bad=False)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, keys)
        result = backfill(instance, spark_resource, lake_root, keys, raise_on_error=False)

        assert not result.success
        records = instance.fetch_materializations(dg.AssetKey("raw_images"), limit=10).records
        assert [r.partition_key for r in records] == ["c0"]  # committed and reported before c1 failed
        failure = result.failure_data_for_node("raw_images").error.message
        assert "c1" in failure and "holds no image files" in failure
        assert Lake(str(lake_root)).tables.partitions("raw_images") == ["c0"]


@pytest.mark.timeout(300)
def test_raw_images_checks_judge_every_batch_of_a_backfill_run(tmp_path, spark_resource):
    """The GE checks of a multi-batch run evaluate each batch and name the one that fails."""
    from imagefactory import write_mostly_corrupt_batch

    from dgx_assets.defs.ingest.checks import raw_image_checks

    lake_root = tmp_path / "lake"
    keys = ["d0", "d1", "d2"]
    write_batch(lake_root / "landing", "d0", bad=False)
    write_mostly_corrupt_batch(lake_root / "landing", "d1")
    write_batch(lake_root / "landing", "d2", seed=2, bad=False)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, keys)
        result = dg.materialize(
            [raw_images, *raw_image_checks],
            instance=instance,
            resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
            tags={RANGE_START: keys[0], RANGE_END: keys[-1]},
            raise_on_error=False,
        )
        evaluations = {e.asset_check_key.name: e for e in result.get_asset_check_evaluations()}

    assert set(evaluations) == {check.check_key.name for check in raw_image_checks}  # every check ran, none crashed
    share = evaluations["valid_image_share"]
    assert not share.passed and "[d1]" in share.description and "d0" not in share.description
    batches = share.metadata["batches"].value
    assert {batch: outcome["passed"] for batch, outcome in batches.items()} == {"d0": True, "d1": False, "d2": True}
    assert evaluations["labels_expected"].passed and evaluations["no_duplicate_content"].passed
