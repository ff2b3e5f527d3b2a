"""The one Markdown table builder: the Dagster UI's metadata (metadata.table), the quality report's summary and
the challenger comparison all write tables with it. Plain Python, so Dagster-free cores can use it."""

from __future__ import annotations

from collections.abc import Sequence


def cell(value: object) -> str:
    """One cell: floats to 4 significant digits, None empty, pipes escaped, newlines folded."""
    if isinstance(value, float):
        value = f"{value:.4g}"
    return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")


def table_lines(headers: Sequence[object], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table as lines: the header row, its rule, one line per row."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def table(headers: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table as one string."""
    return "\n".join(table_lines(headers, rows))
