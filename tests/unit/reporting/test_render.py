"""The report's verdict rules and its HTML, on hand-made inputs (the full pipeline test covers real ones)."""

import base64
import io
import re

from imagefactory import valid_images
from markupsafe import escape
from PIL import Image

from dgx_assets.reporting import render
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import CheckOutcome, decide

PASSED = CheckOutcome("raw_images", "valid_image_share", "b1", True, "ERROR")


def test_blocking_failure_fails_warning_warns_clean_passes():
    assert decide([PASSED], []).level == "pass"
    warn = CheckOutcome("raw_images", "no_duplicate_content", "b1", False, "WARN")
    assert decide([PASSED, warn], []).level == "warn"
    fail = CheckOutcome("edge_model", "tflite_parity", None, False, "ERROR", "agreement 0.91 < 0.99", blocking=True)
    verdict = decide([PASSED, warn, fail], [])
    assert verdict.level == "fail"
    assert "blocking check tflite_parity failed on edge_model: agreement 0.91 < 0.99" in verdict.reasons
    drifted = CheckOutcome("defect_predictions", "embedding_drift", "line-3", False, "WARN", "embedding drift: drifted")
    assert decide([PASSED, drifted], []).reasons == [
        "warning check embedding_drift failed on defect_predictions[line-3]: embedding drift: drifted"
    ]
    assert decide([PASSED], ["edge_model"]).reasons == ["edge_model has not been materialized"]


def test_a_held_back_version_leads_the_verdict_and_stands_for_its_failed_gate():
    parity = CheckOutcome("edge_model", "parity", None, False, "ERROR", "int8 ships: 15 flips")
    other = CheckOutcome("ernie_generated_images", "generated_images_valid", None, False, "ERROR", "start the server")
    held = "dgx_defect_classifier v1 not promoted, stays candidate; the champion stays none. **edge_model.parity** failed: ..."
    verdict = decide([PASSED, parity, other], [], held_back=held, gate_checks={("edge_model", "parity")})
    assert verdict.level == "fail" and verdict.reasons[0] == held
    assert not any("check parity failed" in reason for reason in verdict.reasons)  # told once, in the decision
    assert "check generated_images_valid failed on ernie_generated_images: start the server" in verdict.reasons
    # Without a held-back decision the failed gate is listed like any other check.
    assert "check parity failed on edge_model: " + parity.summary in decide([parity], []).reasons


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
            "samples": {
                "defective": [
                    (valid_images()["grey.png"], "a solar cell with a crack"),
                    (valid_images()["grey.png"], "<b>bold</b>"),
                ]
            },
        },
        hardware={"kind": "cpu", "cpu_model": "test cpu"},
    )
    page = render.render_html(data, decide(data.checks, []), {"MLflow run": "http://127.0.0.1:5000/#/runs/x"})
    for section in ("verdict", "links", "ingestion", "expectations", "statistics", "model", "edge", "generated", "hardware"):
        assert f"id='{section}'" in page
    assert "Verdict: PASS" in page and "corrupted: 2" in page and "0.995" in page
    assert "<figcaption lang='en'>a solar cell with a crack</figcaption>" in page  # each generated image with its prompt
    assert "<figcaption lang='en'>&lt;b&gt;bold&lt;/b&gt;</figcaption>" in page  # the template escapes what it is given
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
    verdict = decide([PASSED], [], shift)
    assert verdict.level == "warn" and verdict.reasons == [f"label balance shifted: {shift[0]}"]
    page = render.render_html(data, verdict, {})
    assert "id='label-balance'" in page and "Label balance shifted in b1, b3" in page


def test_check_tables_tell_kind_fill_both_columns_of_a_failure_and_mark_its_row():
    passed = CheckOutcome(
        "raw_images",
        "valid_image_share",
        "b1",
        True,
        "ERROR",
        blocking=True,
        great_expectations=True,
        found="98.00% valid (at least 80% needed)",
    )
    failed = CheckOutcome(
        "raw_images",
        "no_duplicate_content",
        "b1",
        False,
        "WARN",
        great_expectations=True,
        found="0 of 1 expectations met; failing: sha256: ab12",
        fix="remove the 2 duplicates",
    )
    gate = CheckOutcome(
        "edge_model", "parity", None, False, "ERROR", found="int8 ships: 15 flips", fix="set `quantization: float16`"
    )
    page = render.render_html(ReportData(checks=[passed, failed, gate]), decide([passed, failed, gate], []), {})
    rows = re.findall(r"<tr( class='failed')?>(.*?)</tr>", page)
    cells = {
        re.findall(r"<td[^>]*>(.*?)</td>", row)[1]: (mark, re.findall(r"<td[^>]*>(.*?)</td>", row))
        for mark, row in rows
        if "<td" in row
    }
    assert cells["valid_image_share"] == ("", [*cells["valid_image_share"][1][:3], "passed", "blocking", passed.found, ""])
    mark, duplicate = cells["no_duplicate_content"]
    assert mark and duplicate[3:] == ["FAILED", "warning", failed.found, "remove the 2 duplicates"]
    mark, parity = cells["parity"]  # a failed row is marked and says both what it found and what to fix
    assert mark and parity[3:] == ["FAILED", "error", "int8 ships: 15 flips", "set <code>quantization: float16</code>"]
    assert "tr.failed td{background" in page  # and the page's style highlights marked rows
    ge_section = page[page.index("id='expectations'") : page.index("id='other-checks'")]
    assert "parity" not in ge_section and "parity" in page[page.index("id='other-checks'") :]


def test_found_and_fix_read_the_description_the_to_fix_entry_and_figures():
    import dagster as dg

    from dgx_assets.reporting.collect import found_and_fix

    fix = "set `quantization: auto`, then re-materialize edge_model"
    assert found_and_fix(False, "int8 ships: 15 of 398 flip.", {"to_fix": fix}) == ("int8 ships: 15 of 398 flip", fix)
    as_logged = {"to_fix": dg.MetadataValue.md(fix)}  # as the event log returns it
    assert found_and_fix(False, "int8 ships: 15 of 398 flip", as_logged)[1] == fix
    stats = {"ge_statistics": {"successful_expectations": 0, "evaluated_expectations": 1}, "failing_examples": {"sha256": ["ab"]}}
    found, fix = found_and_fix(False, "", stats)
    assert found == "0 of 1 expectations met; failing: sha256: ab" and "GE's data docs" in fix
    assert found_and_fix(True, "all fine", {}) == ("all fine", "")
    # A description is what was found: a "To fix:" inside it is not split out (to_fix is the one place)
    assert found_and_fix(False, "odd. To fix: nothing", {})[0] == "odd. To fix: nothing"


def test_the_first_screen_shows_the_decision_every_gated_figure_with_its_threshold_and_markdown_reasons():
    parity = CheckOutcome(
        "edge_model",
        "parity",
        None,
        False,
        "ERROR",
        "int8 ships: 15 flips",
        fix="Set `quantization: auto`",
        figures=(("accuracy_drop_points", 0.5, "max", 1.0), ("negative_flip_rate", 0.0377, "max", 0.02)),
    )
    share = CheckOutcome("raw_images", "valid_image_share", "b1", True, "ERROR", figures=(("valid_share", 0.98, "min", 0.8),))
    # trained_model's gate records its figure like any other check (test_accuracy beside min_test_accuracy)
    model_gate = CheckOutcome(
        "trained_model", "beats_baseline_and_champion", None, True, "ERROR", figures=(("test_accuracy", 0.869, "min", 0.726),)
    )
    promotion = {"decision": "held back", "outcome": "m v1 not promoted, stays candidate; the champion stays none"}
    data = ReportData(
        batches=_batches(0.5),
        checks=[model_gate, share, parity],
        promotion={**promotion, "reason": "**edge_model.parity** failed: int8 ships: `negative_flip_rate` 0.0377"},
        model={"test_metrics": {"accuracy": 0.869, "majority_baseline_accuracy": 0.706}},
    )
    from dgx_assets.defs.edge.champion import held_back_summary

    verdict = decide(data.checks, [], held_back=held_back_summary(data.promotion), gate_checks={("edge_model", "parity")})
    page = render.render_html(data, verdict, {render.DECISION_RUN: "http://127.0.0.1:3000/runs/abc"})
    first_screen = page[: page.index("id='ingestion'")]
    assert "<strong>edge_model.parity</strong> failed: int8 ships: <code>negative_flip_rate</code> 0.0377" in first_screen
    assert "<b>Promotion: held back</b>" in first_screen and "m v1 not promoted, stays candidate" in first_screen
    assert "<a href='http://127.0.0.1:3000/runs/abc'>this Dagster run</a>" in first_screen
    cards = re.findall(r"<div class='figure( failed)?'><b>(.*?)</b>(.*?)<span class='threshold'>(.*?)</span>", first_screen)
    by_label = {label: (bool(failed), value, threshold) for failed, value, label, threshold in cards}
    assert by_label["test accuracy"] == (False, "86.90%", "at least 72.60%")
    assert by_label["negative flip rate"] == (True, "3.77%", "at most 2.00%")
    assert by_label["accuracy drop points"] == (False, "+0.50 points", "at most +1.00 points")
    assert by_label["valid images in 1 batches"] == (False, "100 / 100", "each batch at least 80%")
    gates = first_screen[first_screen.index("id='gates'") :]
    rows = [
        (bool(mark), re.findall(r"<td[^>]*>(.*?)</td>", row))
        for mark, row in re.findall(r"<tr( class='failed')?>(.*?)</tr>", gates)
        if "<td" in row
    ]
    assert [(marked, cells[0], *cells[3:]) for marked, cells in rows] == [
        (False, "trained_model", "test_accuracy", "86.90%", "at least 72.60%", "passed"),
        (False, "raw_images", "valid_share", "98.00%", "at least 80.00%", "passed"),
        (False, "edge_model", "accuracy_drop_points", "+0.50 points", "at most +1.00 points", "passed"),
        (True, "edge_model", "negative_flip_rate", "3.77%", "at most 2.00%", "FAILED"),
    ]
    assert "font-family:system-ui" in page and '"Noto Sans CJK SC"' in page and ":lang(zh-Hans)" in page


def test_every_drift_test_is_shown_not_only_the_flagged_ones():
    data = ReportData(
        statistics={"brightness": {"reference": [0.5] * 5, "per_batch": {"b1": [0.5] * 5, "b2": [0.9] * 5}}},
        ks=[
            {"batch": "b1", "statistic": "brightness", "ks": 0.05, "p_value": 0.9, "flagged": False},
            {"batch": "b2", "statistic": "brightness", "ks": 1.0, "p_value": 0.001, "flagged": True},
        ],
    )
    data.drift = [row for row in data.ks if row["flagged"]]
    page = render.render_html(data, decide([], []), {})
    assert "<td>b1</td><td>brightness</td><td class='num'>0.05</td><td>0.9</td><td>no</td>" in page
    assert "<td>b2</td><td>brightness</td><td class='num'>1</td><td>0.001</td><td>FLAGGED</td>" in page


def test_markdown_summary_keeps_each_figure_on_its_own_line():
    data = ReportData(
        model={"test_metrics": {"accuracy": 0.814, "majority_baseline_accuracy": 0.706}},
        edge={"top1_agreement": 0.98, "size_ratio": 0.125},
        generated={"status_counts": {"valid": 12}},
    )
    summary = render.render_markdown(data, decide([], []), "/lake/quality_report/report.html")
    assert "- Model test accuracy 81.4% (majority baseline 70.6%)" in summary.splitlines()
    assert "- Edge model: agreement 98.0%, size ratio 0.125" in summary.splitlines()
    assert "- Generated images: valid 12" in summary.splitlines()


def test_near_duplicate_generated_images_are_flagged_beside_decodable():
    diverse = CheckOutcome(
        "ernie_generated_images",
        "generated_images_diverse",
        None,
        False,
        "WARN",
        found="mean pairwise distance 0.069 of 12 valid images' EfficientNet-Lite0 embeddings (at least 0.1)",
        figures=(("mean_pairwise_distance", 0.069, "min", 0.1),),
    )
    data = ReportData(checks=[diverse], generated={"status_counts": {"valid": 12}, "rows": 12, "samples": {}})
    page = render.render_html(data, decide(data.checks, []), {})
    assert "<div class='figure failed'><b>0.069</b>generated images: near-duplicates" in page
    assert "<span class='threshold'>at least 0.1</span>" in page and "generated images decodable" in page
    section = page[page.index("id='generated'") :]
    assert f"id='diversity' class='flag'>{escape(diverse.found)}." in section


def test_the_production_section_shows_each_scored_batch_its_drift_and_its_queue():
    from dgx_assets.production.figures import scored_batch

    png = base64.b64encode(next(iter(valid_images().values()))).decode()
    figures = scored_batch(
        {
            "label": [None, None, "functional"],
            "predicted_label": ["defective", "functional", "functional"],
            "defect_probability": [0.9, 0.2, 0.1],
        },
        "defective",
    )
    task = {
        "name": "c1.png",
        "predicted": "defective",
        "margin": 0.02,
        "image": png,
        "saliency": png,
        "saliency_url": "http://x/s.png",
    }
    data = ReportData(
        production=[
            {
                "batch": "line <3>",
                "model_version": "dgx_defect_classifier v2",
                "figures": figures,
                "drift": {"passed": False, "found": "embedding drift: drifted: ROC AUC 0.91"},
                "tasks": [task],
                "import_command": "dgx-assets import-labels EXPORT.json --batch line-3-",
            }
        ]
    )
    page = render.render_html(data, decide([], []), {})
    assert "id='production'" in page and "<h3 id='production-1'>line &lt;3&gt;</h3>" in page
    assert "<td class='num'>3</td><td class='num'>2</td>" in page and "33.3 %" in page  # scored, production, rate
    assert "<p class='flag'><b>Drift:</b> embedding drift: drifted: ROC AUC 0.91.</p>" in page
    assert f'alt="saliency of c1.png" src="data:image/png;base64,{png}"' in page
    assert "<code>dgx-assets import-labels EXPORT.json --batch line-3-</code>" in page
    assert "no batch has been scored" in render.render_html(ReportData(), decide([], []), {})
