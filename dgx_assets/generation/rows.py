"""One table row per prompt: the prompts-table record parsed into a request (or the reason it cannot be
sent), then filled in by calling the service, regenerating what came back bad up to `max_attempts`."""

from __future__ import annotations

import datetime as dt
import re
import zlib
from typing import TYPE_CHECKING

from dgx_assets.generation.png import classify_image, safe_file_name
from dgx_assets.generation.replies import BAD_REPLY
from dgx_assets.generation.table import FAILED, INVALID_PROMPT, REGENERATE, REJECTED

if TYPE_CHECKING:
    from dgx_assets.generation.generate import GenerationJob


def _integer(text, name: str, default: int | None) -> tuple[int | None, str | None]:
    """(value, problem) for a table cell that should hold an integer; blank means the default."""
    if text is None or str(text).strip() == "":
        return default, None
    match = re.fullmatch(r"\s*(-?\d{1,12})(?:\.0*)?\s*", str(text))
    if not match:
        return None, f"{name} {str(text)[:30]!r} is not an integer"
    return int(match.group(1)), None


# A prompt without an id is named after its request key, so it keeps its id from run to run.
DEFAULT_ID_PREFIX, DEFAULT_ID_KEY_CHARS = "row-", 12


def start_row(record: dict, job: GenerationJob, now: dt.datetime) -> dict:
    """An output row for one prompt, with its request parsed (or the reason it cannot be sent)."""
    key = record["request_key"]
    prompt_id = record.get("id") or f"{DEFAULT_ID_PREFIX}{key[:DEFAULT_ID_KEY_CHARS]}"
    width, width_problem = _integer(record.get("width"), "width", job.default_width)
    height, height_problem = _integer(record.get("height"), "height", job.default_height)
    seed, seed_problem = _integer(record.get("seed"), "seed", zlib.crc32(prompt_id.encode("utf-8", "replace")))
    prompt = record.get("prompt")
    problems = [p for p in (width_problem, height_problem, seed_problem) if p]
    if prompt is None or not prompt.strip():
        problems.insert(0, "the prompt is empty")
    for name, value in (("width", width), ("height", height)):
        if value is not None and value <= 0:
            problems.append(f"{name} must be positive, got {value}")
    if seed is not None and not 0 <= seed < 2**32:
        problems.append(f"seed must be 0..{2**32 - 1}, got {seed}")
    return {
        "id": prompt_id,
        "prompt": prompt,
        "label": record.get("label"),
        "width": width,
        "height": height,
        "seed": seed,
        "used_prompt": None,
        "truncated": None,
        "content": None,
        "file_name": safe_file_name(prompt_id, key),
        "png_path": None,
        "status": INVALID_PROMPT if problems else None,
        "error": "; ".join(problems) or None,
        "endpoint": None,
        "latency_s": None,
        "attempts": 0,
        "http_tries": 0,
        "request_key": key,
        "generated_at": now,
    }


def generate_rows(client, rows: list[dict], max_attempts: int) -> None:
    """Fill in `rows` (from `start_row`) by calling the service, regenerating bad results."""
    pending = [row for row in rows if row["status"] != INVALID_PROMPT]
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        replies = client.generate_many([(r["prompt"], r["width"], r["height"], r["seed"]) for r in pending])
        still = []
        for row, reply in zip(pending, replies):
            row["attempts"] = attempt
            row["http_tries"] += reply.tries
            row["endpoint"] = reply.endpoint or row["endpoint"]
            if reply.ok:
                status, content, reason = classify_image(reply.payload_b64, row["width"], row["height"])
                row.update(
                    status=status,
                    content=content,
                    error=reason,
                    latency_s=reply.latency_s,
                    truncated=reply.truncated,
                    used_prompt=reply.used_prompt,
                )
            else:
                status = {"rejected": REJECTED, BAD_REPLY: BAD_REPLY}.get(reply.error_kind, FAILED)
                row.update(status=status, error=reply.error, content=None)
            if row["status"] in REGENERATE:
                still.append(row)
        pending = still
