"""Landing batches whose names are URI syntax (`#`, `?`, `%`, a space, NFC and NFD letters) through a real
Dagster instance, a real SparkSession and a real Iceberg catalog: each is ingested, read back and replaced
as a batch of its own, and `lotA#retry` never touches `lotA`."""

import os
import unicodedata

import dagster as dg
from imagefactory import valid_images

from dgx_assets.defs.ingest.assets import raw_images
from dgx_assets.defs.resources import LakeResource
from dgx_assets.ingest.landing import look
from dgx_assets.lake.store import Lake
from dgx_assets.partitions import image_batches

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def land(landing, folder: str) -> int:
    images = valid_images(seed=0)
    for name, data in images.items():
        os.makedirs(landing / folder / "functional", exist_ok=True)
        (landing / folder / "functional" / name).write_bytes(data)
    return len(images)


def ingest(instance, spark_resource, lake_root, batch):
    instance.add_dynamic_partitions(image_batches.name, [batch])
    return dg.materialize(
        [raw_images],
        instance=instance,
        partition_key=batch,
        resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
    )


def data_files(lake_root) -> set[str]:
    return {
        os.path.join(top, name)
        for top, _, names in os.walk(lake_root / "warehouse")
        for name in names
        if name.endswith(".parquet")
    }


def test_batch_names_that_are_uri_syntax_ingest_read_back_and_leave_each_other_alone(tmp_path, spark_resource, started_spark):
    lake_root = tmp_path / "lake"
    landing = lake_root / "landing"
    count = land(landing, "lotA")
    tables = Lake(str(lake_root)).tables
    with dg.instance_for_test() as instance:
        assert ingest(instance, spark_resource, lake_root, "lotA").success
        lota_files = data_files(lake_root)
        names = ["lotA#retry", "lot 7", NFD, "50%", "a?b"]
        for name in names:
            land(landing, name)
        zone = look(str(landing))
        assert sorted(zone.batches) == sorted(["lotA", "lotA#retry", "lot 7", NFC, "50%", "a?b"])  # café once, in NFC
        for name in sorted(zone.batches):
            if name != "lotA":
                assert ingest(instance, spark_resource, lake_root, name).success, name
                assert lota_files <= data_files(lake_root), name  # lotA's committed files, each still there
        assert tables.partitions("raw_images") == sorted(zone.batches)
        for name in zone.batches:
            scanned = tables.scan("raw_images", columns=["batch", "label", "status"])
            rows = scanned.to_pylist() if scanned is not None else []
            mine = [row for row in rows if row["batch"] == name]
            assert len(mine) == count and {row["label"] for row in mine} == {"functional"}, name
            frame = tables.spark_frame(started_spark, "raw_images", name)
            assert frame.count() == count and {row.batch for row in frame.select("batch").collect()} == {name}
        # Re-ingested: `lotA#retry` replaces its own rows only.
        assert ingest(instance, spark_resource, lake_root, "lotA#retry").success
        assert tables.spark_frame(started_spark, "raw_images", "lotA").count() == count
        assert tables.spark_frame(started_spark, "raw_images", "lotA#retry").count() == count
        assert lota_files <= data_files(lake_root)
