"""The report's champion/challenger section: real challenger_model output (from a real Spark run) beside
trained_model's model_info, drawn into the quality report's HTML and Markdown."""

from __future__ import annotations

import json

from dgx_assets.challenger import report
from dgx_assets.lake.store import Lake
from dgx_assets.reporting import render
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import decide

TRAINED = {
    "backbone": "efficientnet_lite0",
    "registered_model_name": "dgx_defect_classifier",
    "model_version": "3",
    "test_metrics": {
        "accuracy": 0.8125,
        "accuracy_ci95_low": 0.68,
        "accuracy_ci95_high": 0.90,
        "macro_f1": 0.7712,
        "images": 48.0,
    },
}
EDGE = {"keras_latency_ms": 12.5, "tflite_latency_ms": 3.25}


def _challenger_lake(tmp_path, images=48.0):
    """A lake holding what challenger_model writes (its model_info.json keys)."""
    folder = tmp_path / "lake" / "challenger_model"
    folder.mkdir(parents=True)
    info = {
        "registered_model_name": "dgx_defect_challenger",
        "model_version": "2",
        "inference_ms_per_image": 0.0421,
        "test_metrics": {
            "accuracy": 0.9375,
            "accuracy_ci95_low": 0.83,
            "accuracy_ci95_high": 0.98,
            "macro_f1": 0.9301,
            "images": images,
        },
    }
    (folder / "model_info.json").write_text(json.dumps(info))
    return Lake(str(tmp_path / "lake"))


def test_both_models_side_by_side_in_the_report(tmp_path):
    comparison = report.compare(_challenger_lake(tmp_path), TRAINED, EDGE)
    data = ReportData(model=TRAINED, edge=EDGE, comparison=comparison)
    page = render.render_html(data, decide([], [], []), {})
    section = page[page.index("id='challenger'") : page.index("id='edge'")]
    for text in (
        "dgx_defect_classifier v3",
        "81.2%",
        "68.0% to 90.0%",
        "0.771",
        "Keras 12.50 ms/image",
        "TFLite 3.25 ms/image",
        "dgx_defect_challenger v2",
        "93.8%",
        "83.0% to 98.0%",
        "0.930",
        "0.042 ms/image on the embedding",
    ):
        assert text in section, text
    assert "different numbers of images" not in section
    summary = render.render_markdown(data, decide([], [], []), "report.html")
    assert "| challenger_model (XGBoost on embeddings) | dgx_defect_challenger v2 | 93.8% |" in summary


def test_different_test_sets_and_missing_models_are_said(tmp_path):
    comparison = report.compare(_challenger_lake(tmp_path, images=30.0), TRAINED, None)
    html = report.render_html(comparison)
    assert "different numbers of images" in html and "not measured (materialize edge_model)" in html
    only_trained = report.compare(Lake(str(tmp_path / "empty")), TRAINED, EDGE)
    assert "challenger_model has not been materialized" in report.render_html(only_trained)
    assert report.compare(Lake(str(tmp_path / "empty")), None, None) is None
    assert "Neither trained_model nor challenger_model" in report.render_html(None)
