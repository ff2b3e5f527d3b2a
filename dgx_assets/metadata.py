"""Materialization metadata as a person reads it in the Dagster UI: rounded numbers, Markdown tables instead
of JSON blobs, and column schemas (`dagster/column_schema`) for the table assets. Imports only dagster."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import dagster as dg

COLUMN_SCHEMA = "dagster/column_schema"


def number(value: float | None, places: int = 4) -> float | None:
    """A float rounded for reading (0.12741354309629924 -> 0.1274); None for missing or non-finite values."""
    if value is None or not math.isfinite(float(value)):
        return None
    return round(float(value), places)


def _cell(value) -> str:
    if isinstance(value, float):
        value = f"{value:.4g}"
    return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> dg.MetadataValue:
    """A Markdown table (the UI renders it as a table)."""
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines))


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
