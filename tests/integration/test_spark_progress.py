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


def test_a_logger_gets_the_tasks_as_structured_progress(started_spark):
    import logging

    from dgx_assets.progress import progress_of

    records = []
    logger = logging.getLogger("dgx-test-spark-progress")
    logger.propagate, logger.level = False, logging.INFO
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)

    def slow(rows):
        for row in rows:
            time.sleep(0.5)
            yield row

    try:
        with spark_progress(started_spark, logger.info, every_seconds=0.5):
            started_spark.sparkContext.parallelize(range(8), 2).mapPartitions(slow).count()
    finally:
        logger.removeHandler(handler)
    progress = [progress_of(record) for record in records]
    assert progress and all(p["kind"] == "spark_tasks" and p["total"] == 2 and 0 <= p["done"] <= 2 for p in progress)
