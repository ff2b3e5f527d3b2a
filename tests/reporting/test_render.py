"""The report's verdict rules and its HTML, on hand-made inputs (the full pipeline test covers real ones)."""

import base64
import io
import re

from imagefactory import valid_images
from PIL import Image

from dgx_assets.reporting import render
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import CheckOutcome, decide

PASSED = CheckOutcome("raw_images", "valid_image_share", "b1", True, "ERROR")


def test_blocking_failure_fails_warning_warns_clean_passes():
    assert decide([PASSED], [], []).level == "pass"
    warn = CheckOutcome("raw_images", "no_duplicate_content", "b1", False, "WARN")
    assert decide([PASSED, warn], [], []).level == "warn"
    fail = CheckOutcome("edge_model", "tflite_parity", None, False, "ERROR", "agreement 0.91 < 0.99")
    verdict = decide([PASSED, warn, fail], [], [])
    assert verdict.level == "fail"
    assert "blocking check tflite_parity failed on edge_model: agreement 0.91 < 0.99" in verdict.reasons
    assert decide([PASSED], ["brightness of batch b2"], []).level == "warn"
    assert decide([PASSED], [], ["edge_model"]).reasons == ["edge_model has not been materialized"]


def test_html_is_self_contained_with_valid_inline_pngs():
    data = ReportData(
        batches={"b1": {"files_listed": 12, "valid": 10, "quarantined": {"corrupted": 2}, "bytes": 999,
                        "labels": {"defective": 4, "functional": 6}}},
        checks=[PASSED],
        statistics={"brightness": {"reference": [0.4, 0.5, 0.45, 0.5, 0.41], "per_batch": {"b1": [0.4, 0.6, 0.5]}}},
        model={"class_names": ["defective", "functional"], "confusion_matrix": [[3, 1], [0, 6]],
               "test_metrics": {"accuracy": 0.9, "majority_baseline_accuracy": 0.6, "f1_defective": 0.85}},
        curves={"loss": [(0, 0.9), (1, 0.5)], "val_loss": [(0, 1.0), (1, 0.7)]},
        edge={"top1_agreement": 0.995, "size_ratio": 0.27},
        generated={"status_counts": {"valid": 3}, "samples": {"defective": [valid_images()["grey.png"]]}, "rows": 3},
        hardware={"kind": "cpu", "cpu_model": "test cpu"},
    )
    page = render.render_html(data, decide(data.checks, [], []), {"MLflow run": "http://127.0.0.1:5000/#/runs/x"})
    for section in ("verdict", "ingestion", "expectations", "statistics", "model", "edge", "generated", "hardware", "links"):
        assert f"id='{section}'" in page
    assert "Verdict: PASS" in page and "corrupted: 2" in page and "0.995" in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 5  # ingestion, brightness, accuracy, confusion matrix, curves, sample
    for encoded in images:
        with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
            image.verify()
    assert "http" not in page.replace("http://127.0.0.1:5000/#/runs/x", "")  # nothing fetched from elsewhere
