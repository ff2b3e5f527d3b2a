"""raw_images through a real Dagster instance and a real SparkSession."""

import os

import dagster as dg
import pyarrow.parquet as pq
import pytest
from imagefactory import bad_files, valid_images, write_batch, write_mostly_corrupt_batch
from support.hostile import SECRET, hostile_batch
from support.lake_tables import read_rows

from dgx_assets.defs.ingest.assets import raw_images
from dgx_assets.defs.ingest.checks import raw_image_checks
from dgx_assets.defs.resources import LakeResource
from dgx_assets.ingest import images
from dgx_assets.lake.store import Lake
from dgx_assets.partitions import image_batches

ONLY_THE_ASSET = dg.AssetSelection.assets(raw_images).without_checks()


def materialize_batch(
    instance, spark_resource, lake_root, batch, selection=None, raise_on_error=True, config=None, writer="arrow"
):
    instance.add_dynamic_partitions(image_batches.name, [batch])
    return dg.materialize(
        [raw_images, *raw_image_checks],
        instance=instance,
        partition_key=batch,
        resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root), table_writer=writer)},
        selection=selection,
        raise_on_error=raise_on_error,
        run_config={"ops": {"raw_images": {"config": config}}} if config else None,
    )


def read_partition(lake_root, batch, snapshot_id=None):
    return read_rows(lake_root, "raw_images", batch, snapshot_id)


def test_every_file_has_a_row_and_valid_bytes_survive(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    expected = write_batch(lake_root / "landing", "b1")
    (lake_root / "landing" / "b1" / "functional" / "_SUCCESS").write_bytes(b"")
    (lake_root / "landing" / "b1" / "functional" / ".hidden.png").write_bytes(b"x")
    with dg.instance_for_test() as instance:
        result = materialize_batch(instance, spark_resource, lake_root, "b1", selection=ONLY_THE_ASSET)
        assert result.success  # ten bad files, and the Spark job still succeeds
        rows = read_partition(lake_root, "b1")
        by_name = {"/".join(row["path"].split("/")[-2:]): row for row in rows}
        assert set(by_name) == set(expected)  # markers and hidden files are not ingested
        for name, status in expected.items():
            row = by_name[name]
            assert row["status"] == status, (name, row["reason"])
            assert row["reason"] is not None
            assert row["split"] in ("train", "validation", "test") or status == "too_large"
        for label in ("defective", "functional"):
            for name, data in valid_images(seed=0 if label == "defective" else 1).items():
                assert by_name[f"{label}/{name}"]["content"] == data  # byte for byte
        assert by_name["defective/truncated.png"]["content"] is None
        metadata = result.asset_materializations_for_node("raw_images")[0].metadata
        assert metadata["files_listed"].value == len(expected)
        assert metadata["valid"].value == 20
        assert "| corrupted | 3 |" in metadata["quarantined"].value  # a Markdown table the UI renders
        columns = {c.name: c for c in metadata["dagster/column_schema"].value.columns}
        assert {"path", "label", "status", "reason", "split", "content"} <= set(columns)
        assert columns["status"].type == "string" and "quarantined" in columns["status"].description
        # The materialization names the Iceberg table and the snapshot it committed.
        current = Lake(str(lake_root)).tables.table("raw_images").current_snapshot().snapshot_id
        assert metadata["table"].value == "dgx.raw_images" and metadata["snapshot_id"].value == str(current)


def test_files_over_the_byte_limit_are_listed_not_read_and_the_files_are_uncompressed(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    expected = write_batch(lake_root / "landing", "b5", bad=False)
    limit = 50_000
    assert all(len(data) <= limit for data in valid_images().values())
    # Noise named .png: read, it would be `not_an_image`; `too_large` shows it was judged from the listing.
    (lake_root / "landing" / "b5" / "functional" / "huge.png").write_bytes(os.urandom(limit + 1))
    (lake_root / "landing" / "b5" / "loose.png").write_bytes(valid_images()["grey.png"])  # no label folder
    with dg.instance_for_test() as instance:
        materialize_batch(instance, spark_resource, lake_root, "b5", selection=ONLY_THE_ASSET, config={"max_file_bytes": limit})
    rows = {"/".join(row["path"].split("/")[-2:]): row for row in read_partition(lake_root, "b5")}
    assert set(rows) == set(expected) | {"functional/huge.png", "b5/loose.png"}
    assert {rows[name]["status"] for name in expected} == {"valid"}
    huge = rows["functional/huge.png"]
    assert (huge["status"], huge["size_bytes"], huge["content"]) == ("too_large", limit + 1, None)
    assert "content not read" in huge["reason"]
    loose = rows["b5/loose.png"]  # no label folder: a production image, kept and never trained on
    assert (loose["status"], loose["label"], loose["split"]) == ("valid", None, "unlabelled")
    assert loose["content"] == valid_images()["grey.png"]
    lake = Lake(str(lake_root))
    for path in lake.tables.snapshot("raw_images", batch="b5").paths:
        metadata = pq.ParquetFile(path).metadata  # PNG/JPEG bytes are not compressed a second time
        codecs = {
            metadata.row_group(g).column(c).compression
            for g in range(metadata.num_row_groups)
            for c in range(metadata.num_columns)
        }
        assert codecs == {"UNCOMPRESSED"}, (path, codecs)


def test_mostly_corrupt_batch_fails_the_blocking_check_and_stops_downstream(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    write_mostly_corrupt_batch(lake_root / "landing")

    @dg.asset(partitions_def=image_batches, deps=[raw_images])
    def downstream_of_raw_images():
        return None

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["bad"])
        result = dg.materialize(
            [raw_images, *raw_image_checks, downstream_of_raw_images],
            instance=instance,
            partition_key="bad",
            resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
            raise_on_error=False,
        )
        share = {e.check_name: e for e in result.get_asset_check_evaluations()}["valid_image_share"]
        assert not share.passed
        assert share.description == "14.3% of batch bad decoded as images (at least 80% needed)"
        assert "fix or remove the bad files" in share.metadata["to_fix"].value  # the UI, the CLI and the report
        assert share.metadata["failing_examples"].value["status"] == ["corrupted"] * 6
        assert not result.asset_materializations_for_node("downstream_of_raw_images")


def test_a_few_bad_files_pass_the_blocking_check(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    write_batch(lake_root / "landing", "b2", bad=False)
    folder = lake_root / "landing" / "b2" / "functional"
    (folder / "truncated.png").write_bytes(bad_files()["truncated.png"][0])
    with dg.instance_for_test() as instance:
        result = materialize_batch(instance, spark_resource, lake_root, "b2")
        share = {e.check_name: e for e in result.get_asset_check_evaluations()}["valid_image_share"]
        assert share.passed and share.metadata["valid_share"].value > 0.9
        assert "ge_data_docs" in share.metadata
        others = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert others == {"valid_image_share": True, "image_bounds": True, "labels_expected": True, "no_duplicate_content": True}
        # Each validation is named in GE's data docs by asset, check and batch.
        index = (tmp_path / "dgx" / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html").read_text()
        assert all(f"raw_images.{name}[b2]" in index for name in others)


def test_duplicates_and_unknown_labels_warn_with_examples(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    write_batch(lake_root / "landing", "b4", labels=("defective", "scratched"), bad=False)
    folder = lake_root / "landing" / "b4" / "defective"
    (folder / "copy_of_grey.png").write_bytes((folder / "grey.png").read_bytes())
    with dg.instance_for_test() as instance:
        result = materialize_batch(instance, spark_resource, lake_root, "b4")
        assert result.success  # warnings do not stop the run
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert not checks["no_duplicate_content"].passed
        assert checks["no_duplicate_content"].severity == dg.AssetCheckSeverity.WARN
        assert not checks["labels_expected"].passed
        assert "scratched" in checks["labels_expected"].metadata["failing_examples"].value["label"]


def test_rematerializing_replaces_the_partition(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    write_batch(lake_root / "landing", "b3", bad=False)
    with dg.instance_for_test() as instance:
        one = materialize_batch(instance, spark_resource, lake_root, "b3", selection=ONLY_THE_ASSET)
        first = len(read_partition(lake_root, "b3"))
        (lake_root / "landing" / "b3" / "functional" / "grey.png").unlink()
        # The other table writer (Spark's own) makes the same table.
        materialize_batch(instance, spark_resource, lake_root, "b3", selection=ONLY_THE_ASSET, writer="spark")
        assert len(read_partition(lake_root, "b3")) == first - 1
        # The first version is still there to be read (time travel), by the snapshot id its run recorded.
        old = one.asset_materializations_for_node("raw_images")[0].metadata["snapshot_id"].value
        assert len(read_partition(lake_root, "b3", int(old))) == first


@pytest.mark.timeout(300)
def test_a_hostile_batch_is_ingested_with_a_row_per_entry_and_its_fingerprint_recorded(tmp_path, spark_resource):
    from dgx_assets.ingest.landing import scan_landing

    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    with hostile_batch(landing, tmp_path / "outside") as expected, dg.instance_for_test() as instance:
        result = materialize_batch(instance, spark_resource, lake_root, "hostile", selection=ONLY_THE_ASSET)
        fingerprint = scan_landing(str(landing))["hostile"].fingerprint
    rows = {row["path"].rsplit("/", 1)[1]: row for row in read_partition(lake_root, "hostile")}
    assert {name: row["status"] for name, row in rows.items()} == expected
    assert images.sha256_hex(SECRET) not in {row["sha256"] for row in rows.values()}
    metadata = result.asset_materializations_for_node("raw_images")[0].metadata
    assert "| special_file | 2 |" in metadata["quarantined"].value and "| symlink | 5 |" in metadata["quarantined"].value
    assert metadata["landing_fingerprint"].value == fingerprint  # what the sensor compares
