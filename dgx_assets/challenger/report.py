"""The quality report's "Champion and challenger" section: trained_model beside challenger_model.

``compare`` collects one row per model from what each wrote (model_info.json of both, edge_model's parity
metadata for the Keras and TFLite latencies); ``render_html`` (templates/challenger.html.j2) and
``render_markdown`` draw it. Both models
are scored on image_features' test split; the row says how many test images each saw, so a comparison on
different data shows as such.
"""

from __future__ import annotations

from typing import Any

from dgx_assets.markdown import table_lines


def _row(name: str, info: dict[str, Any], cost: str) -> dict[str, Any]:
    metrics = info.get("test_metrics") or {}
    return {
        "model": name,
        "version": f"{info.get('registered_model_name', '')} v{info.get('model_version', '')}",
        "accuracy": metrics.get("accuracy"),
        "ci95": (metrics.get("accuracy_ci95_low"), metrics.get("accuracy_ci95_high")),
        "macro_f1": metrics.get("macro_f1"),
        "images": metrics.get("images"),
        "cost": cost,
    }


def compare(lake: Any, model: dict[str, Any] | None, edge: dict[str, Any] | None) -> dict[str, Any] | None:
    """None when neither model exists; else the rows and a note when their test sets differ in size."""
    from dgx_assets.challenger.tracking import read_challenger_info

    challenger = read_challenger_info(lake)
    if not model and not challenger:
        return None
    rows = []
    if model:
        edge = edge or {}
        costs = [
            f"Keras {edge['keras_latency_ms']:.2f} ms/image" if edge.get("keras_latency_ms") is not None else "",
            f"TFLite {edge['tflite_latency_ms']:.2f} ms/image" if edge.get("tflite_latency_ms") is not None else "",
        ]
        rows.append(
            _row(
                f"trained_model ({model.get('backbone', 'keras')})",
                model,
                ", ".join(c for c in costs if c) or "not measured (materialize edge_model)",
            )
        )
    if challenger:
        rows.append(
            _row(
                "challenger_model (XGBoost on embeddings)",
                challenger,
                f"{challenger['inference_ms_per_image']:.3f} ms/image on the embedding, plus the backbone's "
                "forward pass that computes it",
            )
        )
    sizes = {row["images"] for row in rows}
    note = (
        ""
        if len(sizes) == 1
        else "The two models were tested on different numbers of images: re-materialize both on the same image_features."
    )
    return {"rows": rows, "note": note, "missing": [] if challenger else ["challenger_model"] if model else ["trained_model"]}


def _interval(ci: tuple[float | None, float | None]) -> str:
    low, high = ci
    return "n/a" if low is None or high is None else f"{low:.1%} to {high:.1%}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _cells(row: dict[str, Any]) -> list[str]:
    images = "n/a" if row["images"] is None else str(int(row["images"]))
    return [
        row["model"],
        row["version"],
        _share(row["accuracy"]),
        _interval(row["ci95"]),
        "n/a" if row["macro_f1"] is None else f"{row['macro_f1']:.3f}",
        images,
        row["cost"],
    ]


HEADERS = ["model", "registered version", "test accuracy", "95 % interval", "macro-F1", "test images", "inference cost"]


def render_html(comparison: dict[str, Any] | None) -> str:
    """The section of the quality report (templates/challenger.html.j2)."""
    from dgx_assets.templating import render

    rows = [_cells(row) for row in comparison["rows"]] if comparison else []
    return render("dgx_assets.challenger", "challenger.html.j2", comparison=comparison, headers=HEADERS, rows=rows)


def render_markdown(comparison: dict[str, Any] | None) -> list[str]:
    if not comparison:
        return []
    return table_lines(HEADERS, [_cells(row) for row in comparison["rows"]]) + [""]
