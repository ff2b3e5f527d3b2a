"""The quality report's production section: per scored batch, what the champion said, the drift verdict, and the
review queue with its thumbnails and Grad-CAM pictures (templates/production.html.j2)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from typing import Any

from dgx_assets.lake.store import Lake
from dgx_assets.production import review
from dgx_assets.production.drift import DRIFT_CHECK
from dgx_assets.production.figures import scored_batch
from dgx_assets.production.scoring import PREDICTIONS_TABLE
from dgx_assets.reporting.verdict import CheckOutcome
from dgx_assets.training.decision import POSITIVE_CLASS

SHOWN_TASKS = 8  # of a queue, in the report: the least sure; the rest are in tasks.json
THUMBNAIL = 128  # pixels, longest side: the page stays a few hundred KB


def production(lake: Lake, checks: Sequence[CheckOutcome]) -> list[dict]:
    """One entry per batch defect_predictions holds: figures, drift, queue (empty when nothing was scored)."""
    table = lake.tables.scan(
        PREDICTIONS_TABLE, ["batch", "label", "predicted_label", "defect_probability", "model_name", "model_version"]
    )
    if table is None:
        return []
    rows = table.to_pydict()
    drift = {c.partition: c for c in checks if c.asset == PREDICTIONS_TABLE and c.check == DRIFT_CHECK}
    sections = []
    for batch in sorted(set(rows["batch"])):
        mine = [i for i, b in enumerate(rows["batch"]) if b == batch]
        figures = scored_batch({name: [rows[name][i] for i in mine] for name in rows}, POSITIVE_CLASS)
        check = drift.get(batch)
        sections.append(
            {
                "batch": batch,
                "model_version": f"{rows['model_name'][mine[0]]} v{rows['model_version'][mine[0]]}",
                "figures": figures,
                "drift": None if check is None else {"passed": check.passed, "found": check.found or check.summary},
                "tasks": _queue(lake, batch),
                "import_command": review.import_command(batch),
            }
        )
    return sections


def _queue(lake: Lake, batch: str) -> list[dict]:
    folder = review.queue_uri(lake, batch)
    tasks_uri = f"{folder}/{review.TASKS_FILE}"
    if not lake.exists(tasks_uri):
        return []
    shown = []
    for task in json.loads(lake.read_bytes(tasks_uri))[:SHOWN_TASKS]:
        data, prediction = task["data"], task["predictions"][0]
        sha = data["sha256"]
        extension = data["image"].rsplit(".", 1)[-1]
        shown.append(
            {
                "name": data["path"].rsplit("/", 1)[-1],
                "predicted": prediction["result"][0]["value"]["choices"][0],
                "margin": prediction["score"],
                "image": _thumbnail(lake.read_bytes("/".join([folder, *review.image_file(sha, extension)]))),
                "saliency": _thumbnail(lake.read_bytes("/".join([folder, *review.saliency_file(sha)]))),
                "saliency_url": data["saliency"],
            }
        )
    return shown


def _thumbnail(content: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(content)) as image:
        image.thumbnail((THUMBNAIL, THUMBNAIL))
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def render_html(sections: list[dict[str, Any]]) -> str:
    from dgx_assets.templating import render

    return render("dgx_assets.reporting", "production.html.j2", sections=sections)
