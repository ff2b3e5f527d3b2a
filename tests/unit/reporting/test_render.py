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
        batches={
            "b1": {
                "files_listed": 12,
                "valid": 10,
                "quarantined": {"corrupted": 2},
                "bytes": 999,
                "labels": {"defective": 4, "functional": 6},
            }
        },
        checks=[PASSED],
        statistics={"brightness": {"reference": [0.4, 0.5, 0.45, 0.5, 0.41], "per_batch": {"b1": [0.4, 0.6, 0.5]}}},
        model={
            "class_names": ["defective", "functional"],
            "confusion_matrix": [[3, 1], [0, 6]],
            "test_metrics": {"accuracy": 0.9, "majority_baseline_accuracy": 0.6, "f1_defective": 0.85},
        },
        curves={"loss": [(0, 0.9), (1, 0.5)], "val_loss": [(0, 1.0), (1, 0.7)]},
        edge={"top1_agreement": 0.995, "size_ratio": 0.27},
        generated={
            "status_counts": {"valid": 3},
            "rows": 3,
            "samples": {"defective": [(valid_images()["grey.png"], "a solar cell with a crack")]},
        },
        hardware={"kind": "cpu", "cpu_model": "test cpu"},
    )
    page = render.render_html(data, decide(data.checks, [], []), {"MLflow run": "http://127.0.0.1:5000/#/runs/x"})
    for section in ("verdict", "links", "ingestion", "expectations", "statistics", "model", "edge", "generated", "hardware"):
        assert f"id='{section}'" in page
    assert "Verdict: PASS" in page and "corrupted: 2" in page and "0.995" in page
    assert "<figcaption>a solar cell with a crack</figcaption>" in page  # each generated image with its prompt
    assert page.index("id='links'") < page.index("id='ingestion'")  # on the first screen
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 5  # ingestion, brightness, accuracy, confusion matrix, curves, sample
    for encoded in images:
        with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
            image.verify()
    assert "http" not in page.replace("http://127.0.0.1:5000/#/runs/x", "")  # nothing fetched from elsewhere


def _batches(*defective_shares):
    return {
        f"b{i}": {
            "files_listed": 100,
            "valid": 100,
            "quarantined": {},
            "bytes": 1,
            "labels": {"defective": round(100 * share), "functional": 100 - round(100 * share)},
        }
        for i, share in enumerate(defective_shares, 1)
    }


def test_label_balance_shift_between_batches_is_flagged_and_warns():
    from dgx_assets.reporting.collect import label_balance

    rows = {row["batch"]: row for row in label_balance(_batches(0.56, 0.25, 0.13))}  # what ELPV's three batches hold
    assert rows["b1"]["flagged"] and rows["b1"]["class"] == "defective" and rows["b1"]["points"] > 30
    assert rows["b3"]["flagged"] and rows["b3"]["points"] < -10
    steady = label_balance(_batches(0.30, 0.27, 0.33))
    assert not any(row["flagged"] for row in steady)  # a few points either way is sampling noise
    assert label_balance(_batches(0.5)) == []  # one batch has nothing to be compared with

    data = ReportData(batches=_batches(0.56, 0.25, 0.13), label_balance=list(rows.values()))
    shift = ["batch b1 has 56% defective against 19% in the other batches"]
    verdict = decide([PASSED], [], [], shift)
    assert verdict.level == "warn" and verdict.reasons == [f"label balance shifted: {shift[0]}"]
    page = render.render_html(data, verdict, {})
    assert "id='label-balance'" in page and "Label balance shifted in b1, b3" in page


def test_check_tables_tell_kind_and_only_failures_get_what_to_fix():
    passed = CheckOutcome(
        "raw_images",
        "valid_image_share",
        "b1",
        True,
        "ERROR",
        "98.0% of batch b1 are valid images",
        blocking=True,
        great_expectations=True,
    )
    failed = CheckOutcome(
        "raw_images", "no_duplicate_content", "b1", False, "WARN", "remove the 2 duplicates", great_expectations=True
    )
    gate = CheckOutcome("edge_model", "tflite_parity", None, False, "ERROR", "set quantization: float16", blocking=True)
    page = render.render_html(ReportData(checks=[passed, failed, gate]), decide([passed, failed, gate], [], []), {})
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    cells = {re.findall(r"<td[^>]*>(.*?)</td>", row)[1]: re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows if "<td" in row}
    assert cells["valid_image_share"][3:] == ["passed", "blocking", "98.0% of batch b1 are valid images", ""]
    assert cells["no_duplicate_content"][3:] == ["FAILED", "warning", "", "remove the 2 duplicates"]
    assert "ERROR" not in page  # a passed check is no error
    ge_section = page[page.index("id='expectations'") : page.index("id='other-checks'")]
    assert "tflite_parity" not in ge_section and "tflite_parity" in page[page.index("id='other-checks'") :]


def test_every_drift_test_is_shown_not_only_the_flagged_ones():
    data = ReportData(
        statistics={"brightness": {"reference": [0.5] * 5, "per_batch": {"b1": [0.5] * 5, "b2": [0.9] * 5}}},
        ks=[
            {"batch": "b1", "statistic": "brightness", "ks": 0.05, "p_value": 0.9, "flagged": False},
            {"batch": "b2", "statistic": "brightness", "ks": 1.0, "p_value": 0.001, "flagged": True},
        ],
    )
    data.drift = [row for row in data.ks if row["flagged"]]
    page = render.render_html(data, decide([], ["brightness of batch b2"], []), {})
    assert "<td>b1</td><td>brightness</td><td class='num'>0.05</td><td>0.9</td><td>no</td>" in page
    assert "<td>b2</td><td>brightness</td><td class='num'>1</td><td>0.001</td><td>FLAGGED</td>" in page


def test_markdown_summary_keeps_each_figure_on_its_own_line():
    data = ReportData(
        model={"test_metrics": {"accuracy": 0.814, "majority_baseline_accuracy": 0.706}},
        edge={"top1_agreement": 0.98, "size_ratio": 0.125},
        generated={"status_counts": {"valid": 12}},
    )
    summary = render.render_markdown(data, decide([], [], []), "/lake/quality_report/report.html")
    assert "- Model test accuracy 81.4% (majority baseline 70.6%)" in summary.splitlines()
    assert "- Edge model: agreement 98.0%, size ratio 0.125" in summary.splitlines()
    assert "- Generated images: valid 12" in summary.splitlines()
