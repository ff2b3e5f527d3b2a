"""The Parquet settings of the image tables, checked on files a real Spark writer wrote."""

import os

import pyarrow.parquet as pq

from dgx_assets.spark.parquet import ROW_GROUP_BYTES, image_table_options


def test_image_bytes_get_no_dictionary_or_statistics_and_row_groups_stay_small(started_spark, tmp_path):
    spark = started_spark
    rows = [(f"label-{i % 3}", os.urandom(100_000)) for i in range(400)]  # 40 MB of incompressible "images"
    frame = spark.createDataFrame(rows, "label string, content binary").coalesce(1)
    frame.write.mode("overwrite").options(**image_table_options("content", compression="none")).parquet(str(tmp_path / "t"))

    [part] = [p for p in (tmp_path / "t").iterdir() if p.suffix == ".parquet"]
    metadata = pq.ParquetFile(part).metadata
    assert metadata.num_row_groups >= 2  # 40 MB in groups of about 16 MB
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        assert group.total_byte_size <= 1.5 * ROW_GROUP_BYTES
        label, content = group.column(0), group.column(1)
        assert label.is_stats_set and label.has_dictionary_page  # other columns keep both
        assert not content.is_stats_set and not content.has_dictionary_page
        assert content.compression == "UNCOMPRESSED"
    assert sorted(pq.read_table(part).column("content").to_pylist()) == sorted(content for _, content in rows)
