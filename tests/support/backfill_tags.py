"""The run tags a single-run backfill carries, as Dagster's UI shows them (Dagster's constants are private)."""

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
