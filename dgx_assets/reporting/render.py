"""The quality report as one self-contained HTML page (charts inlined) and as a Markdown summary."""

from __future__ import annotations

import base64
import html
import io

from dgx_assets.reporting import charts
from dgx_assets.reporting.collect import ReportData
from dgx_assets.reporting.verdict import Verdict

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.verdict{padding:.8em 1.2em;border-radius:6px;font-size:1.1em}.pass{background:#dfd}.warn{background:#ffd}.fail{background:#fdd}
.grid img{width:120px;height:120px;margin:3px;border:1px solid #ccc;image-rendering:pixelated}
.muted{color:#777}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


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
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>dgx_assets quality report</title>"
             f"<style>{_STYLE}</style></head><body><h1>dgx_assets quality report</h1>"]
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in verdict.reasons)
    parts.append(f"<div class='verdict {verdict.level}' id='verdict'><b>Verdict: {verdict.level.upper()}</b><ul>{reasons}</ul></div>")

    parts.append("<h2 id='ingestion'>Ingestion per batch</h2>")
    if data.batches:
        rows = [[b, s["files_listed"], s["valid"], ", ".join(f"{k}: {v}" for k, v in s["quarantined"].items()) or "none",
                 ", ".join(f"{k}: {v}" for k, v in s["labels"].items()), s["bytes"]] for b, s in data.batches.items()]
        parts.append(_table(["batch", "files listed", "valid", "quarantined by reason", "label balance", "bytes"], rows))
        parts.append(_img(charts.ingestion_bars(data.batches), "files per batch"))
    else:
        parts.append("<p class='muted'>raw_images has not been materialized.</p>")

    parts.append("<h2 id='expectations'>Great Expectations results</h2>")
    if data.checks:
        parts.append(_table(["asset", "check", "partition", "result", "severity", "what to fix"],
                            [[c.asset, c.check, c.partition or "", "passed" if c.passed else "FAILED", c.severity, c.summary]
                             for c in data.checks]))
    if data.ge_data_docs:
        parts.append(f"<p><a href='{html.escape(data.ge_data_docs)}'>Great Expectations data docs</a></p>")

    parts.append("<h2 id='statistics'>Image statistics and drift</h2>")
    if data.statistics:
        for name, values in data.statistics.items():
            parts.append(_img(charts.statistic_boxes(values["per_batch"], values["reference"], name), name))
        parts.append(_table(["batch", "statistic", "KS statistic", "p-value"],
                            [[d["batch"], d["statistic"], d["ks"], d["p_value"]] for d in data.drift])
                     if data.drift else "<p>No batch drifted from the training data.</p>")
    else:
        parts.append("<p class='muted'>image_features has not been materialized.</p>")

    parts.append("<h2 id='model'>Model</h2>")
    model = data.model
    if model:
        metrics = model.get("test_metrics", {})
        edge_accuracy = (data.edge or {}).get("tflite_test_accuracy")
        parts.append(_img(charts.accuracy_bars(metrics.get("accuracy", 0.0), metrics.get("majority_baseline_accuracy"),
                                               edge_accuracy), "accuracy"))
        classes = model.get("class_names", [])
        parts.append(_table(["class", "precision", "recall", "F1", "support"],
                            [[c, metrics.get(f"precision_{c}"), metrics.get(f"recall_{c}"), metrics.get(f"f1_{c}"),
                              metrics.get(f"support_{c}")] for c in classes]))
        parts.append(_table(["metric", "value"], [[k, metrics.get(k)] for k in
                                                  ("accuracy", "majority_baseline_accuracy", "macro_f1", "roc_auc")]))
        if model.get("confusion_matrix"):
            parts.append(_img(charts.confusion_heatmap(model["confusion_matrix"], classes), "confusion matrix"))
        if data.curves:
            parts.append(_img(charts.training_curves(data.curves), "training curves"))
        parts.append(f"<p>{html.escape(model.get('registered_model_name', ''))} version "
                     f"{html.escape(str(model.get('model_version', '')))}, trained in {model.get('training_seconds')} s "
                     f"on {html.escape(str(model.get('hardware_kind')))}.</p>")
    else:
        parts.append("<p class='muted'>trained_model has not been materialized.</p>")

    parts.append("<h2 id='edge'>Edge model</h2>")
    if data.edge:
        keys = ("quantization", "tflite_size_bytes", "keras_size_bytes", "size_ratio", "top1_agreement",
                "max_probability_difference", "tflite_test_accuracy", "keras_test_accuracy", "tflite_latency_ms",
                "keras_latency_ms", "latency_ratio")
        parts.append(_table(["figure", "value"], [[k, data.edge.get(k)] for k in keys if k in data.edge]))
    else:
        parts.append("<p class='muted'>edge_model has not been materialized.</p>")

    parts.append("<h2 id='generated'>Generated images (ERNIE-Image)</h2>")
    if data.generated:
        parts.append(_table(["status", "images"], [[k, v] for k, v in data.generated["status_counts"].items()]))
        for label, samples in data.generated["samples"].items():
            thumbs = "".join(_img(_thumbnail(s), label) for s in samples)
            parts.append(f"<h3>{html.escape(label)}</h3><div class='grid'>{thumbs}</div>")
    else:
        parts.append("<p class='muted'>ernie_generated_images has not been materialized.</p>")

    parts.append("<h2 id='hardware'>Hardware baseline</h2>")
    parts.append(f"<pre>{html.escape(_hardware_text(data.hardware))}</pre>" if data.hardware else
                 "<p class='muted'>No hardware baseline was logged.</p>")

    parts.append("<h2 id='links'>Links</h2><ul>" + "".join(
        f"<li>{html.escape(name)}: <a href='{html.escape(url)}'>{html.escape(url)}</a></li>" for name, url in links.items()
    ) + "</ul></body></html>")
    return "\n".join(parts)


def _hardware_text(hardware: dict) -> str:
    shown = {k: v for k, v in hardware.items() if k != "nvidia_smi_query"}
    lines = [f"{k}: {v}" for k, v in shown.items()]
    if hardware.get("nvidia_smi_query"):
        lines.append(hardware["nvidia_smi_query"][:4000])
    return "\n".join(lines)


def render_markdown(data: ReportData, verdict: Verdict, report_path: str) -> str:
    lines = [f"**Verdict: {verdict.level.upper()}**", ""] + [f"- {r}" for r in verdict.reasons] + [""]
    if data.batches:
        lines += ["| batch | files | valid | quarantined |", "|---|---|---|---|"]
        lines += [f"| {b} | {s['files_listed']} | {s['valid']} | {sum(s['quarantined'].values())} |" for b, s in data.batches.items()]
    if data.model:
        metrics = data.model.get("test_metrics", {})
        lines += ["", f"Model test accuracy {metrics.get('accuracy', float('nan')):.3f} "
                      f"(majority baseline {metrics.get('majority_baseline_accuracy', float('nan')):.3f})"]
    if data.edge:
        lines += [f"Edge model: agreement {data.edge.get('top1_agreement')}, size ratio {data.edge.get('size_ratio')}"]
    if data.generated:
        lines += ["Generated images: " + ", ".join(f"{k} {v}" for k, v in data.generated["status_counts"].items())]
    lines += ["", f"Full report: `{report_path}`"]
    return "\n".join(lines)
