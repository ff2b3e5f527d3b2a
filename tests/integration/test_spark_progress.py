import time

from dgx_assets.spark.progress import spark_progress


def test_progress_is_logged_while_a_stage_runs(started_spark):
    spark = started_spark
    messages = []

    def slow(rows):
        for row in rows:
            time.sleep(0.5)
            yield row

    with spark_progress(spark, messages.append, every_seconds=0.5):
        spark.sparkContext.parallelize(range(8), 2).mapPartitions(slow).count()
    assert any("tasks done" in m and m.startswith("Spark: stage") for m in messages), messages
