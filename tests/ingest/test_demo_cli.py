"""What a CLI user of `make demo` sees when a blocking check holds a batch back: the check's what-to-fix text,
not a Dagster stack trace."""

import dagster as dg
from imagefactory import bad_files, valid_images

from dgx_assets.demo import _DemoOutcome, execute_for_cli
from dgx_assets.ingest.assets import raw_images
from dgx_assets.ingest.checks import raw_image_checks
from dgx_assets.partitions import image_batches
from dgx_assets.resources import LakeResource


def test_a_blocking_check_that_holds_a_batch_back_shows_what_to_fix_not_a_stack_trace(tmp_path, spark_resource, capfd):
    lake_root = tmp_path / "lake"
    folder = lake_root / "landing" / "bad" / "defective"
    folder.mkdir(parents=True)
    for index in range(6):
        (folder / f"broken{index}.png").write_bytes(bad_files()["truncated.png"][0])
    (folder / "good.png").write_bytes(valid_images()["grey.png"])

    @dg.asset(partitions_def=image_batches, deps=[raw_images])
    def image_features_stand_in():
        return None

    defs = dg.Definitions(assets=[raw_images, image_features_stand_in], asset_checks=raw_image_checks,
                          resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))})
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["bad"])
        capfd.readouterr()
        result = execute_for_cli(defs.resolve_implicit_global_asset_job_def(), instance, partition_key="bad")
        outcome = _DemoOutcome()
        outcome.add(instance, result, "batch bad")
    printed = capfd.readouterr()
    console = printed.out + printed.err
    fix = "Only 14.3% of batch bad decoded as images (at least 80% needed)"
    assert not result.success and not result.asset_materializations_for_node("image_features_stand_in")
    assert "STEP_FAILURE" in console and "A blocking check held it back. raw_images:valid_image_share: " + fix in console
    assert "Stack Trace" not in console and "DagsterAssetCheckFailedError" not in console
    assert outcome.errors == [] and len(outcome.gates) == 1
    assert outcome.gates[0].startswith("batch bad: raw_images:valid_image_share: " + fix)
