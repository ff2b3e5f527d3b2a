"""The quality report as one self-contained HTML page (templates/report.html.j2, charts inlined) and as a Markdown
summary for Dagster's UI."""

from __future__ import annotations

import base64
import io

from markupsafe import Markup

from dgx_assets.challenger import report as challenger_report
from dgx_assets.gates import within
from dgx_assets.markdown import table_lines
from dgx_assets.metadata import human_size
from dgx_assets.production.drift import DRIFT_CHECK
from dgx_assets.reporting import charts, production
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import Verdict
from dgx_assets.templating import fmt, render


def _chart(png: bytes, alt: str) -> dict:
    """An image the template inlines as a data: URI, so the page needs nothing beside itself."""
    return {"alt": alt, "base64": base64.b64encode(png).decode()}


def _comparison_rows(model: dict, edge: dict | None) -> list[list]:
    """Ours (with the backbone and weights that made it) beside the published ELPV results."""
    metrics = model.get("test_metrics", {})
    low, high = metrics.get("accuracy_ci95_low"), metrics.get("accuracy_ci95_high")
    interval = f"{low:.1%} – {high:.1%}" if low is not None and high is not None else "n/a"
    weights = model.get("pretrained_weights") or {}
    source = (
        f", {weights.get('pretrained_weights_package')} {weights.get('pretrained_weights_package_version', '')}"
        f" ({weights.get('pretrained_weights_file')}, sha256 {str(weights.get('pretrained_weights_sha256', ''))[:12]})"
        if weights
        else ""
    )
    images = metrics.get("images")
    rows = [
        [
            f"trained_model: {model.get('backbone', 'unknown backbone')}{source}",
            _percent(metrics.get("accuracy")),
            interval,
            int(images) if images else "n/a",
            metrics.get("macro_f1"),
        ]
    ]
    if edge and edge.get("tflite_test_accuracy") is not None:
        rows.append(
            [
                f"edge_model ({edge.get('format', 'TFLite')})",
                _percent(edge["tflite_test_accuracy"]),
                "",
                int(images) if images else "n/a",
                "",
            ]
        )
    rows += [
        [f"published: {name} (Deitsch et al. 2019, 25 % test split)", _percent(value), "", 656, ""]
        for name, value in charts.YARDSTICKS.items()
    ]
    return rows


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _thumbnail(data: bytes) -> bytes:
    """Re-encode a sample as a small PNG so the page stays light whatever the generator returned."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.thumbnail((128, 128))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()


DECISION_RUN = "Dagster run that made the promotion decision"  # the links entry the decision line points at
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei", "WenQuanYi Micro Hei")


def render_html(data: ReportData, verdict: Verdict, links: dict[str, str]) -> str:
    """The page (templates/report.html.j2); every section is None or empty when its asset is not built."""
    great = [c for c in data.checks if c.great_expectations]
    others = [c for c in data.checks if not c.great_expectations]
    return render(
        "dgx_assets.reporting",
        "report.html.j2",
        cjk_fonts=CJK_FONTS,
        verdict=verdict,
        decision=_decision(data.promotion, links.get(DECISION_RUN)),
        key_figures=_key_figures(data),
        gates=_gate_rows(data),
        ladder=_ladder(data.edge_ladder),
        links=links,
        ingestion=_ingestion(data),
        check_headers=["asset", "check", "batch", "result", "kind", "found", "what to fix"],
        great_expectations=_check_rows(great),
        other_checks=_check_rows(others),
        ge_data_docs=data.ge_data_docs,
        statistics=_statistics(data),
        label_balance=_label_balance(data),
        model=_model(data),
        # Rendered by its own autoescaping template, so it is markup already.
        challenger=Markup(challenger_report.render_html(data.comparison)),
        production=Markup(production.render_html(data.production)),
        edge=_edge_figures(data.edge),
        generated=_generated(data),
        hardware=_hardware_text(data.hardware) if data.hardware else None,
    )


def _decision(promotion: dict | None, run_url: str | None) -> dict | None:
    """champion_model's latest decision, for the line under the verdict."""
    if not promotion:
        return None
    return {
        "decision": promotion.get("decision", ""),
        "outcome": promotion.get("outcome", ""),
        "held_back": promotion.get("decision") == "held back",
        "run_url": run_url,
        "version_url": promotion.get("mlflow_model_version"),
    }


def _figure(name: str, value: float) -> str:
    """A gated figure in its unit: shares and rates in percent, points signed, counts as they are."""
    if name.endswith(("share", "rate", "accuracy")):
        return f"{value:.2%}"
    if name.endswith("points"):
        return f"{value:+.2f} points"
    return fmt(float(value)) if isinstance(value, float) else str(value)


def _limit(name: str, bound: str, limit: float) -> str:
    return f"{'at most' if bound == 'max' else 'at least'} {_figure(name, limit)}"


def _gate_rows(data: ReportData) -> dict:
    """Every figure a gate compares with a threshold, and the result; failed rows are marked."""
    rows, failed = [], []
    for check in data.checks:
        for name, value, bound, limit in check.figures:
            rows.append([check.asset, check.check, check.partition or "", name, _figure(name, value), _limit(name, bound, limit)])
            failed.append(not within(value, bound, limit))
    for row, bad in zip(rows, failed):
        row.append("FAILED" if bad else "passed")
    return {"headers": ["asset", "gate", "batch", "figure", "value", "threshold", "result"], "rows": rows, "failed": failed}


def _edge_figures(edge: dict | None) -> list[list] | None:
    return [[key, edge[key]] for key in _EDGE_FIGURES if key in edge] if edge else None


_EDGE_FIGURES = (
    "format",
    "tflite_size",
    "keras_size",
    "size_ratio",
    "top1_agreement",
    "max_probability_difference",
    "tflite_test_accuracy",
    "keras_test_accuracy",
    "tflite_latency_ms",
    "keras_latency_ms",
    "latency_ratio",
)


def _ingestion(data: ReportData) -> dict | None:
    if not data.batches:
        return None
    rows = [
        [
            b,
            s["files_listed"],
            s["valid"],
            ", ".join(f"{k}: {v}" for k, v in s["quarantined"].items()) or "none",
            ", ".join(f"{k}: {v}" for k, v in s["labels"].items()),
            human_size(s["bytes"]),
        ]
        for b, s in data.batches.items()
    ]
    return {
        "headers": ["batch", "files listed", "valid", "quarantined by reason", "label balance", "size"],
        "rows": rows,
        "chart": _chart(charts.ingestion_bars(data.batches), "files per batch"),
    }


def _statistics(data: ReportData) -> dict | None:
    if not data.statistics:
        return None
    return {
        "charts": [
            _chart(charts.statistic_boxes(values["per_batch"], values["reference"], name), name)
            for name, values in data.statistics.items()
        ],
        "rows": [
            [d["batch"], d["statistic"], d["ks"], f"{d['p_value']:.2g}", "FLAGGED" if d["flagged"] else "no"] for d in data.ks
        ],
        "drifted": bool(data.drift),
    }


def _model(data: ReportData) -> dict | None:
    model = data.model
    if not model:
        return None
    metrics = model.get("test_metrics", {})
    edge_accuracy = (data.edge or {}).get("tflite_test_accuracy")
    classes = model.get("class_names", [])
    # Keras and MLflow count epochs from 0; people, the README and this page from 1.
    epochs = {key: [(step + 1, value) for step, value in points] for key, points in data.curves.items()}
    best_epoch = model["best_epoch"] + 1 if model.get("best_epoch") is not None else None
    accuracy = charts.accuracy_bars(metrics.get("accuracy", 0.0), metrics.get("majority_baseline_accuracy"), edge_accuracy)
    return {
        "accuracy_chart": _chart(accuracy, "accuracy"),
        "classes": [
            [c, metrics.get(f"precision_{c}"), metrics.get(f"recall_{c}"), metrics.get(f"f1_{c}"), metrics.get(f"support_{c}")]
            for c in classes
        ],
        "comparison": _comparison_rows(model, data.edge),
        "metrics": [[k, metrics.get(k)] for k in ("accuracy", "majority_baseline_accuracy", "macro_f1", "roc_auc")],
        "confusion_chart": (
            _chart(charts.confusion_heatmap(model["confusion_matrix"], classes), "confusion matrix")
            if model.get("confusion_matrix")
            else None
        ),
        "curves_chart": _chart(charts.training_curves(epochs, best_epoch), "training curves") if data.curves else None,
        "best_epoch": best_epoch,
        "epochs": max((len(points) for points in epochs.values()), default=0),
        "version": f"{model.get('registered_model_name', '')} version {model.get('model_version', '')}",
        "training_seconds": model.get("training_seconds"),
        "hardware_kind": str(model.get("hardware_kind")),
    }


def _diversity(checks) -> dict | None:
    """generated_images_diverse's latest result: the batch's mean pairwise distance against its threshold."""
    for check in checks:
        for name, value, bound, limit in check.figures if check.check == "generated_images_diverse" else ():
            return {
                "value": f"{value:.3f}",
                "threshold": _limit(name, bound, limit),
                "flagged": not check.passed,
                "found": check.found,
            }
    return None


def _generated(data: ReportData) -> dict | None:
    generated = data.generated
    if not generated:
        return None
    return {
        "counts": [[k, v] for k, v in generated["status_counts"].items()],
        "diversity": _diversity(data.checks),
        "samples": {
            label: [{"chart": _chart(_thumbnail(png), prompt or label), "prompt": prompt} for png, prompt in samples]
            for label, samples in generated["samples"].items()
        },
    }


def _key_figures(data: ReportData) -> list[dict]:
    """The first screen's cards; a gated figure carries its threshold and is marked when its gate failed."""
    figures = []

    def card(value: str, label: str, threshold: str = "", failed: bool = False) -> None:
        figures.append({"value": value, "label": label, "threshold": threshold, "failed": failed})

    if data.promotion:
        held = data.promotion.get("decision") == "held back"
        card(str(data.promotion.get("decision")), str(data.promotion.get("outcome")), failed=held)
    if data.batches:
        valid = sum(s["valid"] for s in data.batches.values())
        listed = sum(s["files_listed"] for s in data.batches.values())
        shares = [c for c in data.checks if c.check == "valid_image_share"]
        minimum = min((limit for c in shares for name, _, _, limit in c.figures if name == "valid_share"), default=None)
        card(
            f"{valid:,} / {listed:,}",
            f"valid images in {len(data.batches)} batches",
            f"each batch at least {minimum:.0%}" if minimum is not None else "",
            any(not c.passed for c in shares),
        )
    gated_accuracy = [f for c in data.checks if c.asset == "trained_model" for f in c.figures if f[0] == "test_accuracy"]
    if gated_accuracy:
        name, value, bound, limit = gated_accuracy[0]
        card(_figure(name, value), "test accuracy", _limit(name, bound, limit), not within(value, bound, limit))
    elif data.model:
        card(_share(data.model.get("test_metrics", {}).get("accuracy")), "test accuracy", "no gated threshold recorded")
    if data.edge_ladder:
        card(
            data.edge_ladder["format"],
            "edge format shipped",
            "parity gate " + ("passed" if data.edge_ladder["passed"] else "failed"),
        )
    for check in (c for c in data.checks if c.asset == "edge_model" and c.check == "parity"):
        for name, value, bound, limit in check.figures:
            passed = within(value, bound, limit)
            card(_figure(name, value), name.replace("_", " "), _limit(name, bound, limit), not passed)
    if data.generated:
        counts = data.generated["status_counts"]
        card(f"{counts.get('valid', 0)} / {sum(counts.values())}", "generated images decodable")
    diversity = _diversity(data.checks)
    if diversity:
        label = "generated images: near-duplicates" if diversity["flagged"] else "generated images differ"
        card(diversity["value"], f"{label} (mean pairwise distance)", diversity["threshold"], diversity["flagged"])
    flagged = sum(not c.passed for c in data.checks if c.check == DRIFT_CHECK) + sum(row["flagged"] for row in data.label_balance)
    card(
        str(flagged), "drift or label-shift flags", "embedding drift (AUC > 0.55, p < 0.01); class share 10 points off, p < 0.01"
    )
    return figures


def _ladder(ladder: dict | None) -> dict | None:
    """Every format the ladder tried, against trained_model on the test images; "(shipped)" marks the one shipped."""
    if not ladder:
        return None
    rows = []
    for trial in ladder["trials"]:
        if trial.get("error"):
            rows.append([trial["format"], "", "", "", "", "", f"failed to build: {trial['error']}"])
            continue
        rows.append(
            [
                trial["format"] + (" (shipped)" if trial["format"] == ladder["format"] else ""),
                trial["size_ratio"],
                trial["latency_ratio"],
                _percent(trial["accuracy"]),
                _percent(trial["agreement"]),
                f"{trial['negative_flips']} ({trial['negative_flip_rate']:.1%})",
                "pass" if trial["passed"] else "fail: " + "; ".join(trial["failed_criteria"]),
            ]
        )
    headers = ["format", "size ratio", "latency ratio", "accuracy", "agreement with trained_model", "negative flips", "gate"]
    return {"reason": ladder["reason"], "headers": headers, "rows": rows}


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _check_rows(checks) -> dict:
    """Result per check and batch: what it found, and what to fix when it failed (those rows are marked)."""
    rows = [
        [
            c.asset,
            c.check,
            c.partition or "",
            "passed" if c.passed else "FAILED",
            "blocking" if c.blocking else ("error" if c.severity == "ERROR" else "warning"),
            c.found,
            "" if c.passed else c.fix,
        ]
        for c in checks
    ]
    return {"rows": rows, "failed": [not c.passed for c in checks]}


def _label_balance(data: ReportData) -> dict | None:
    """Beside the image statistics: a batch whose class shares differ from the other batches' is flagged."""
    if not data.label_balance:
        return None
    classes = sorted({c for row in data.label_balance for c in row["shares"]})
    rows = [
        [
            row["batch"],
            *(f"{row['shares'].get(c, 0):.0%}" for c in classes),
            f"{row['class']} {row['points']:+.1f} points ({row['share']:.0%} vs {row['others_share']:.0%})",
            f"{row['p_value']:.2g}",
            "FLAGGED" if row["flagged"] else "no",
        ]
        for row in data.label_balance
    ]
    return {
        "chart": _chart(charts.label_shares(data.batches), "label balance per batch"),
        "headers": ["batch", *(f"{c} share" for c in classes), "largest gap to the other batches", "p-value", "shift"],
        "rows": rows,
        "flagged": [row["batch"] for row in data.label_balance if row["flagged"]],
    }


def _hardware_text(hardware: dict) -> str:
    shown = {k: v for k, v in hardware.items() if k != "nvidia_smi_query"}
    lines = [f"{k}: {human_size(v) if k.endswith('_bytes') and isinstance(v, int) else v}" for k, v in shown.items()]
    if hardware.get("nvidia_smi_query"):
        lines.append(hardware["nvidia_smi_query"][:4000])
    return "\n".join(lines)


def render_markdown(data: ReportData, verdict: Verdict, report_path: str) -> str:
    """The summary the Dagster UI shows: blank lines between blocks, or Markdown runs them together."""
    lines = [f"**Verdict: {verdict.level.upper()}**", ""] + [f"- {r}" for r in verdict.reasons] + [""]
    if data.promotion:
        lines += [f"**Promotion: {data.promotion.get('decision')}**: {data.promotion.get('outcome')}", ""]
    if data.batches:
        rows = [[b, s["files_listed"], s["valid"], sum(s["quarantined"].values())] for b, s in data.batches.items()]
        lines += table_lines(["batch", "files", "valid", "quarantined"], rows) + [""]
    figures = []
    if data.model:
        metrics = data.model.get("test_metrics", {})
        figures.append(
            f"Model test accuracy {_share(metrics.get('accuracy'))} "
            f"(majority baseline {_share(metrics.get('majority_baseline_accuracy'))})"
        )
    if data.edge:
        figures.append(
            f"Edge model: agreement {_share(data.edge.get('top1_agreement'))}, size ratio {fmt(data.edge.get('size_ratio'))}"
        )
    if data.generated:
        figures.append("Generated images: " + ", ".join(f"{k} {v}" for k, v in data.generated["status_counts"].items()))
    lines += [f"- {figure}" for figure in figures] + ([""] if figures else [])
    lines += challenger_report.render_markdown(data.comparison)
    lines += [f"Full report: `{report_path}`"]
    return "\n".join(lines)
