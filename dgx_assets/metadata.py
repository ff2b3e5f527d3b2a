"""Materialization metadata as a person reads it in the Dagster UI: rounded numbers, Markdown tables instead
of JSON blobs, and column schemas (`dagster/column_schema`) for the table assets. Imports only dagster."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import dagster as dg

from dgx_assets import markdown

COLUMN_SCHEMA = "dagster/column_schema"
# The one way a failed check or a held-back decision says what to fix: this metadata entry, beside a description
# that says what was found. The quality report, champion_model and the demo's console read it.
TO_FIX = "to_fix"


def number(value: float | None, digits: int = 4) -> float | None:
    """A float rounded for reading to `digits` significant digits (0.8366834170854272 -> 0.8367, 1234.567 -> 1235);
    None for missing or non-finite values."""
    if value is None or not math.isfinite(float(value)):
        return None
    return float(f"{float(value):.{digits}g}")


def human_size(size_bytes: int | None) -> str:
    """A byte count as people read it: 1.234 MB (1,234,456 bytes)."""
    if size_bytes is None:
        return "n/a"
    value, unit = float(size_bytes), "bytes"
    for name in ("kB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, name
    return f"{size_bytes:,} bytes" if unit == "bytes" else f"{value:.4g} {unit} ({size_bytes:,} bytes)"


def gated(name: str, figure: float, threshold: float, bound: str = "max") -> dict[str, float | None]:
    """A figure a check compares with a threshold, as two metadata entries side by side: `name` and `max_name`
    (at most) or `min_name` (at least). The report and champion_model read them back with `thresholds`."""
    if bound not in ("min", "max"):
        raise ValueError(f"bound is min or max, not {bound!r}")
    return {name: number(figure), f"{bound}_{name}": number(threshold)}


def thresholds(metadata: Mapping[str, object]) -> list[tuple[str, float, str, float]]:
    """(name, figure, bound, threshold) for every `name` beside a `min_name` or `max_name` in `metadata` (values,
    or MetadataValues), in the metadata's order."""
    values = {key: getattr(value, "value", value) for key, value in metadata.items()}
    found = []
    for name, figure in values.items():
        for bound in ("min", "max"):
            threshold = values.get(f"{bound}_{name}")
            if isinstance(figure, (int, float)) and isinstance(threshold, (int, float)) and not isinstance(figure, bool):
                found.append((name, float(figure), bound, float(threshold)))
    return found


def to_fix(text: str) -> dict[str, dg.MetadataValue]:
    """The `to_fix` entry for `text` (Markdown), or nothing when there is nothing to fix."""
    return {TO_FIX: dg.MetadataValue.md(text)} if text else {}


def fix_of(metadata: Mapping[str, object]) -> str:
    """The `to_fix` text of a check's or materialization's metadata (values or MetadataValues); empty if none."""
    value = metadata.get(TO_FIX)
    return str(getattr(value, "value", value) or "")


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> dg.MetadataValue:
    """A Markdown table (the UI renders it as a table)."""
    return dg.MetadataValue.md(markdown.table(headers, rows))


def counts(mapping: Mapping, what: str, of: str = "count") -> dg.MetadataValue:
    """A two-column Markdown table of counts (labels, splits, statuses), with its total."""
    rows = [[key, value] for key, value in mapping.items()]
    if all(isinstance(v, int) for v in mapping.values()) and len(rows) > 1:
        rows.append(["**total**", sum(mapping.values())])
    return table([what, of], rows)


def confusion(matrix: Sequence[Sequence[int]], classes: Sequence[str]) -> dg.MetadataValue:
    """Rows are the true class, columns the predicted one."""
    return table(["true \\ predicted", *classes], [[name, *row] for name, row in zip(classes, matrix)])


def column_schema(arrow_schema, descriptions: Mapping[str, str]) -> dg.TableSchema:
    """The Parquet schema a table asset wrote, with a description per known column."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=field.name, type=str(field.type), description=descriptions.get(field.name))
            for field in arrow_schema
        ]
    )


def table_snapshot(lake, table: str, snapshot_id: int) -> dict[str, dg.MetadataValue]:
    """Which Iceberg table and snapshot a materialization committed: the lineage a reader can go back to.
    The id is text: 64-bit snapshot ids lose digits as JavaScript numbers in the UI."""
    from dgx_assets.lake.tables import NAMESPACE

    location = lake.tables.table(table).location()
    return {
        "table": dg.MetadataValue.text(f"{NAMESPACE}.{table}"),
        "snapshot_id": dg.MetadataValue.text(str(snapshot_id)),
        "path": dg.MetadataValue.path(location),
    }
