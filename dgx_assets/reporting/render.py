"""The quality report as one self-contained HTML page (charts inlined) and as a Markdown summary."""

from __future__ import annotations

import base64
import html
import io

from dgx_assets.challenger import report as challenger_report
from dgx_assets.reporting import charts
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import Verdict

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}
th{background:#f3f3f3}td.num{text-align:right}
.verdict{padding:.8em 1.2em;border-radius:6px;font-size:1.1em}.pass{background:#dfd}.warn{background:#ffd}.fail{background:#fdd}
.grid{display:flex;flex-wrap:wrap;gap:6px}.grid figure{margin:0;width:132px;font-size:11px;color:#444}
.grid img{width:128px;height:128px;border:1px solid #ccc;image-rendering:pixelated}
.muted{color:#777}.flag{color:#a40;font-weight:bold}.ok{color:#272}
.figures{display:flex;flex-wrap:wrap;gap:10px;margin:1em 0}.figure{border:1px solid #ddd;border-radius:6px;padding:.5em .9em}
.figure b{display:block;font-size:1.4em}.links li{margin:.2em 0}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


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
                f"edge_model ({edge.get('quantization', 'TFLite')})",
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


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    """Numbers right-aligned (they compare down a column), text left."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"<td class='num'>{html.escape(_fmt(value))}</td>" if number else f"<td>{html.escape(_fmt(value))}</td>"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _thumbnail(data: bytes) -> bytes:
    """Re-encode a sample as a small PNG so the page stays light whatever the generator returned."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.thumbnail((128, 128))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()


def render_html(data: ReportData, verdict: Verdict, links: dict[str, str]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>dgx_assets quality report</title>"
        f"<style>{_STYLE}</style></head><body><h1>dgx_assets quality report</h1>"
    ]
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in verdict.reasons)
    parts.append(
        f"<div class='verdict {verdict.level}' id='verdict'><b>Verdict: {verdict.level.upper()}</b><ul>{reasons}</ul></div>"
    )
    # The first screen: the figures people ask for first, and where to click next.
    parts.append(_key_figures(data))
    parts.append(
        "<h2 id='links'>Links</h2><ul class='links'>"
        + "".join(
            f"<li>{html.escape(name)}: <a href='{html.escape(url)}'>{html.escape(url)}</a></li>" for name, url in links.items()
        )
        + "</ul>"
    )

    parts.append("<h2 id='ingestion'>Ingestion per batch</h2>")
    if data.batches:
        rows = [
            [
                b,
                s["files_listed"],
                s["valid"],
                ", ".join(f"{k}: {v}" for k, v in s["quarantined"].items()) or "none",
                ", ".join(f"{k}: {v}" for k, v in s["labels"].items()),
                s["bytes"],
            ]
            for b, s in data.batches.items()
        ]
        parts.append(_table(["batch", "files listed", "valid", "quarantined by reason", "label balance", "bytes"], rows))
        parts.append(_img(charts.ingestion_bars(data.batches), "files per batch"))
    else:
        parts.append("<p class='muted'>raw_images has not been materialized.</p>")

    parts.append("<h2 id='expectations'>Great Expectations results</h2>")
    great = [c for c in data.checks if c.great_expectations]
    parts.append(_checks_table(great) if great else "<p class='muted'>No Great Expectations suite has run yet.</p>")
    if data.ge_data_docs:
        parts.append(
            f"<p><a href='{html.escape(data.ge_data_docs)}'>Great Expectations data docs</a> "
            "(every validation, named asset.check[batch])</p>"
        )
    others = [c for c in data.checks if not c.great_expectations]
    if others:
        parts.append("<h3 id='other-checks'>Other checks</h3>" + _checks_table(others))

    parts.append("<h2 id='statistics'>Image statistics and drift</h2>")
    if data.statistics:
        for name, values in data.statistics.items():
            parts.append(_img(charts.statistic_boxes(values["per_batch"], values["reference"], name), name))
        parts.append(
            "<p>Each batch against the training data (two-sample Kolmogorov–Smirnov): flagged when "
            "KS &gt; 0.3 and p &lt; 0.01.</p>"
        )
        parts.append(
            _table(
                ["batch", "statistic", "KS statistic", "p-value", "drift"],
                [
                    [d["batch"], d["statistic"], d["ks"], f"{d['p_value']:.2g}", "FLAGGED" if d["flagged"] else "no"]
                    for d in data.ks
                ],
            )
        )
        if not data.drift:
            parts.append("<p class='ok'>No batch drifted from the training data.</p>")
    else:
        parts.append("<p class='muted'>image_features has not been materialized.</p>")
    parts.append(_label_balance(data))

    parts.append("<h2 id='model'>Model</h2>")
    model = data.model
    if model:
        metrics = model.get("test_metrics", {})
        edge_accuracy = (data.edge or {}).get("tflite_test_accuracy")
        parts.append(
            _img(
                charts.accuracy_bars(metrics.get("accuracy", 0.0), metrics.get("majority_baseline_accuracy"), edge_accuracy),
                "accuracy",
            )
        )
        classes = model.get("class_names", [])
        parts.append(
            _table(
                ["class", "precision", "recall", "F1", "support"],
                [
                    [
                        c,
                        metrics.get(f"precision_{c}"),
                        metrics.get(f"recall_{c}"),
                        metrics.get(f"f1_{c}"),
                        metrics.get(f"support_{c}"),
                    ]
                    for c in classes
                ],
            )
        )
        parts.append(
            _table(["model", "test accuracy", "95 % interval", "test images", "macro-F1"], _comparison_rows(model, data.edge))
        )
        parts.append(
            _table(
                ["metric", "value"],
                [[k, metrics.get(k)] for k in ("accuracy", "majority_baseline_accuracy", "macro_f1", "roc_auc")],
            )
        )
        if model.get("confusion_matrix"):
            parts.append(_img(charts.confusion_heatmap(model["confusion_matrix"], classes), "confusion matrix"))
        if data.curves:
            parts.append(_img(charts.training_curves(data.curves, model.get("best_epoch")), "training curves"))
            if model.get("best_epoch") is not None:
                parts.append(
                    f"<p>The model keeps the weights of epoch {model['best_epoch']} (the lowest validation "
                    "loss; early stopping restores them), marked in red.</p>"
                )
        parts.append(
            f"<p>{html.escape(model.get('registered_model_name', ''))} version "
            f"{html.escape(str(model.get('model_version', '')))}, trained in {model.get('training_seconds')} s "
            f"on {html.escape(str(model.get('hardware_kind')))}.</p>"
        )
    else:
        parts.append("<p class='muted'>trained_model has not been materialized.</p>")

    parts.append(challenger_report.render_html(data.comparison))
    parts.append("<h2 id='edge'>Edge model</h2>")
    if data.edge:
        keys = (
            "quantization",
            "tflite_size_bytes",
            "keras_size_bytes",
            "size_ratio",
            "top1_agreement",
            "max_probability_difference",
            "tflite_test_accuracy",
            "keras_test_accuracy",
            "tflite_latency_ms",
            "keras_latency_ms",
            "latency_ratio",
        )
        parts.append(_table(["figure", "value"], [[k, data.edge.get(k)] for k in keys if k in data.edge]))
    else:
        parts.append("<p class='muted'>edge_model has not been materialized.</p>")

    parts.append("<h2 id='generated'>Generated images (ERNIE-Image)</h2>")
    if data.generated:
        parts.append(_table(["status", "images"], [[k, v] for k, v in data.generated["status_counts"].items()]))
        for label, samples in data.generated["samples"].items():
            thumbs = "".join(
                f"<figure>{_img(_thumbnail(png), prompt or label)}<figcaption>{html.escape(prompt)}</figcaption></figure>"
                for png, prompt in samples
            )
            parts.append(f"<h3>{html.escape(label)}</h3><div class='grid'>{thumbs}</div>")
    else:
        parts.append("<p class='muted'>ernie_generated_images has not been materialized.</p>")

    parts.append("<h2 id='hardware'>Hardware baseline</h2>")
    parts.append(
        f"<pre>{html.escape(_hardware_text(data.hardware))}</pre>"
        if data.hardware
        else "<p class='muted'>No hardware baseline was logged.</p>"
    )

    parts.append("</body></html>")
    return "\n".join(parts)


def _key_figures(data: ReportData) -> str:
    figures = []
    if data.batches:
        valid = sum(s["valid"] for s in data.batches.values())
        listed = sum(s["files_listed"] for s in data.batches.values())
        figures.append((f"{valid:,} / {listed:,}", f"valid images in {len(data.batches)} batches"))
    if data.model:
        metrics = data.model.get("test_metrics", {})
        figures.append(
            (
                _share(metrics.get("accuracy")),
                f"test accuracy (majority baseline {_share(metrics.get('majority_baseline_accuracy'))})",
            )
        )
    if data.edge:
        figures.append((_share(data.edge.get("top1_agreement")), "edge model agrees with trained_model"))
    if data.generated:
        counts = data.generated["status_counts"]
        figures.append((f"{counts.get('valid', 0)} / {sum(counts.values())}", "generated images valid"))
    flagged = len(data.drift) + sum(1 for row in data.label_balance if row["flagged"])
    figures.append((str(flagged), "drift or label-shift flags"))
    return (
        "<div class='figures'>"
        + "".join(f"<div class='figure'><b>{html.escape(value)}</b>{html.escape(label)}</div>" for value, label in figures)
        + "</div>"
    )


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _checks_table(checks) -> str:
    """Result per check and batch; the last columns say what a passed check found, or what to fix."""
    rows = [
        [
            c.asset,
            c.check,
            c.partition or "",
            "passed" if c.passed else "FAILED",
            "blocking" if c.blocking else "warning",
            c.summary if c.passed else "",
            "" if c.passed else c.summary,
        ]
        for c in checks
    ]
    return _table(["asset", "check", "batch", "result", "kind", "found", "what to fix"], rows)


def _label_balance(data: ReportData) -> str:
    """Beside the image statistics: a batch whose class shares differ from the other batches' is flagged."""
    if not data.label_balance:
        return ""
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
    flagged = [row["batch"] for row in data.label_balance if row["flagged"]]
    return (
        "<h3 id='label-balance'>Label balance per batch</h3>"
        + _img(charts.label_shares(data.batches), "label balance per batch")
        + "<p>Each batch's class shares against the other batches pooled: flagged when a share is 10 points or "
        "more away and a chi-square test gives p &lt; 0.01.</p>"
        + _table(["batch", *(f"{c} share" for c in classes), "largest gap to the other batches", "p-value", "shift"], rows)
        + (
            f"<p class='flag'>Label balance shifted in {', '.join(flagged)}.</p>"
            if flagged
            else "<p class='ok'>No batch's label balance stands out.</p>"
        )
    )


def _hardware_text(hardware: dict) -> str:
    shown = {k: v for k, v in hardware.items() if k != "nvidia_smi_query"}
    lines = [f"{k}: {v}" for k, v in shown.items()]
    if hardware.get("nvidia_smi_query"):
        lines.append(hardware["nvidia_smi_query"][:4000])
    return "\n".join(lines)


def render_markdown(data: ReportData, verdict: Verdict, report_path: str) -> str:
    """The summary the Dagster UI shows: blank lines between blocks, or Markdown runs them together."""
    lines = [f"**Verdict: {verdict.level.upper()}**", ""] + [f"- {r}" for r in verdict.reasons] + [""]
    if data.batches:
        lines += ["| batch | files | valid | quarantined |", "|---|---|---|---|"]
        lines += [
            f"| {b} | {s['files_listed']} | {s['valid']} | {sum(s['quarantined'].values())} |" for b, s in data.batches.items()
        ]
        lines += [""]
    figures = []
    if data.model:
        metrics = data.model.get("test_metrics", {})
        figures.append(
            f"Model test accuracy {_share(metrics.get('accuracy'))} "
            f"(majority baseline {_share(metrics.get('majority_baseline_accuracy'))})"
        )
    if data.edge:
        figures.append(
            f"Edge model: agreement {_share(data.edge.get('top1_agreement'))}, size ratio {_fmt(data.edge.get('size_ratio'))}"
        )
    if data.generated:
        figures.append("Generated images: " + ", ".join(f"{k} {v}" for k, v in data.generated["status_counts"].items()))
    lines += [f"- {figure}" for figure in figures] + ([""] if figures else [])
    lines += challenger_report.render_markdown(data.comparison)
    lines += [f"Full report: `{report_path}`"]
    return "\n".join(lines)
