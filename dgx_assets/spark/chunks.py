"""Work cut into chunks of about equal bytes, one Spark task per chunk, each run by a Python worker.

Ingest (landed files) and features (raw_images row groups) both know their inputs on the driver from a
listing, and both read them in the Python workers themselves: reading through a Spark source would move
every image's bytes through the JVM and across to Python, which cost more CPU than the work itself on two
cores (bench/ingest.py, bench/features.py). Spark still schedules, retries, places the tasks on executors
(and GPUs) and writes the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

Item = TypeVar("Item")


def pack(items: Sequence[Item], weight: Callable[[Item], int], target_bytes: int, min_chunks: int) -> list[list[Item]]:
    """Cut `items` into runs of about equal weight: at least `min_chunks` (every core busy), none much over
    `target_bytes` unless one item is. Runs keep the items' order, so neighbours (a label folder, the row
    groups of one file) stay together; no chunk is empty."""
    weights = [max(1, weight(item)) for item in items]
    total = sum(weights)
    if not total:
        return []
    count = max(min_chunks, math.ceil(total / target_bytes))
    chunks: list[list[Item]] = [[] for _ in range(count)]
    done = 0
    for item, item_weight in zip(items, weights):
        # By the item's middle, not its start: items of about equal weight then land one per chunk.
        chunks[(2 * done + item_weight) * count // (2 * total)].append(item)
        done += item_weight
    return [chunk for chunk in chunks if chunk]


def map_chunks(spark: Any, chunks: list[list[Item]], work: Callable[[list[Item]], Iterator[pa.RecordBatch]], schema: pa.Schema):
    """A DataFrame of `schema` made by running `work` on each chunk, one partition (and task) per chunk.

    The chunks travel to the executors once, as a broadcast; each task receives only its chunk's id.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    shared = spark.sparkContext.broadcast(chunks)

    def run(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for chunk in batch.column("id").to_pylist():
                yield from work(shared.value[chunk])

    return spark.range(len(chunks), numPartitions=len(chunks)).mapInArrow(run, from_arrow_schema(schema))
