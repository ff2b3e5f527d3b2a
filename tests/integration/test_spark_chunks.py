"""Chunked work: the packing the driver does, and one real Spark task per chunk."""

import pyarrow as pa

from dgx_assets.spark.chunks import map_chunks, pack

OPEN_COST = 65_536


def test_chunks_are_contiguous_balanced_and_cover_every_item():
    sizes = [1000 * (1 + i % 3) for i in range(100)]
    chunks = pack(list(range(100)), lambda i: sizes[i] + OPEN_COST, target_bytes=1_000_000, min_chunks=2)
    assert [item for chunk in chunks for item in chunk] == list(range(100))  # in order, each once
    weights = [sum(sizes[i] + OPEN_COST for i in chunk) for chunk in chunks]
    one_item = 3000 + OPEN_COST
    assert len(chunks) == 7 and max(weights) <= 1_000_000 + one_item and max(weights) - min(weights) <= 2 * one_item
    assert len(pack(list(range(10)), lambda i: sizes[i], target_bytes=1_000_000, min_chunks=4)) == 4  # every core busy
    assert len(pack([0], lambda i: sizes[i], target_bytes=1_000_000, min_chunks=4)) == 1  # and no empty partitions
    assert pack([0, 1, 2], lambda i: 0, target_bytes=10, min_chunks=2) == [[0], [1, 2]]  # zero weights still placed
    assert pack([], lambda i: 1, target_bytes=10, min_chunks=2) == []


def test_each_chunk_runs_once_in_its_own_task(started_spark):
    from pyspark import TaskContext

    spark = started_spark
    schema = pa.schema([("item", pa.string()), ("partition", pa.int32())])
    chunks = [["a", "b"], ["c"], ["d", "e", "f"]]

    def work(chunk):
        partition = TaskContext.get().partitionId()
        yield pa.RecordBatch.from_pydict({"item": chunk, "partition": [partition] * len(chunk)}, schema=schema)

    frame = map_chunks(spark, chunks, work, schema)
    assert frame.rdd.getNumPartitions() == 3
    rows = sorted((row.item, row.partition) for row in frame.collect())
    assert rows == [("a", 0), ("b", 0), ("c", 1), ("d", 2), ("e", 2), ("f", 2)]
