"""The two wire formats the serving process speaks, parsed into one request (plain Python, no paddle).

- Paddle Serving pipeline: `POST /<service>/prediction` with `{"key": [...], "value": [...]}`, reply
  `{"err_no": 0, "err_msg": "", "key": [...], "value": [...]}`. Error codes by range: 5xxx bad input,
  6xxx timeout, 9xxx inference / model state.
- OpenAI images API as SGLang serves ERNIE-Image: `POST /v1/images/generations` with `prompt`, `size`,
  `n`, `seed`, optional `num_inference_steps`; reply `{"created", "data": [{"b64_json", "revised_prompt"}]}`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from dgx_assets.serving.config import Limits, parse_size
from dgx_assets.serving.tokenizer import clean_text

# Error codes (pipeline `err_no`; also reported in OpenAI-style errors as `code`).
BAD_INPUT = 5000
BAD_PROMPT = 5001
BAD_SIZE = 5002
BAD_COUNT = 5003
BAD_SEED = 5004
BAD_STEPS = 5005
BAD_FORMAT = 5006
BODY_TOO_LARGE = 5010
LENGTH_REQUIRED = 5011
NOT_FOUND = 5012
METHOD_NOT_ALLOWED = 5013
BAD_HTTP = 5014  # not parseable HTTP (answered by the protocol layer, before any route)
UNAUTHORIZED = 5100
TIMEOUT = 6000  # no predictor free within request_timeout_s
READ_TIMEOUT = 6001  # the request head or body did not arrive in time (header_timeout_s, body_timeout_s)
QUEUE_FULL = 6002  # max_queue requests already wait
TOO_MANY_CONNECTIONS = 6003
INFERENCE_FAILED = 9000
MODEL_LOADING = 9001
MODEL_FAILED = 9002
ENGINE_UNAVAILABLE = 9003  # the engine said it cannot serve now (device lost, out of memory): retry later


class ApiError(Exception):
    def __init__(self, http_status: int, code: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.http_status, self.code, self.message = http_status, code, message
        self.headers = dict(headers or {})
        if http_status == 503:
            self.headers.setdefault("Retry-After", "1")


def bad(code: int, message: str) -> ApiError:
    return ApiError(400, code, message)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    cleaned: bool  # the prompt had invalid characters that were replaced or dropped
    width: int
    height: int
    seed: int
    steps: int | None
    count: int


def parse_openai(body: dict, limits: Limits, default_size: tuple[int, int]) -> GenerationRequest:
    fmt = body.get("response_format", "b64_json")
    if fmt != "b64_json":
        raise bad(BAD_FORMAT, f"response_format {str(fmt)[:20]!r} is not supported: use 'b64_json'")
    size = body.get("size")
    return _request(
        prompt=body.get("prompt"),
        size=_size(size) if size not in (None, "auto") else default_size,
        seed=body.get("seed"),
        steps=body.get("num_inference_steps", body.get("steps")),
        count=body.get("n", 1),
        limits=limits,
    )


def parse_pipeline(body: dict, limits: Limits, default_size: tuple[int, int]) -> GenerationRequest:
    keys, values = body.get("key"), body.get("value")
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
        raise bad(BAD_INPUT, "'key' and 'value' must be lists of the same length")
    fields = dict(zip((str(k) for k in keys), values))
    width = fields.get("width", default_size[0])
    height = fields.get("height", default_size[1])
    if "size" in fields:
        width, height = _size(fields["size"])
    return _request(
        prompt=fields.get("prompt"),
        size=(_integer(width, "width", BAD_SIZE), _integer(height, "height", BAD_SIZE)),
        seed=fields.get("seed"),
        steps=fields.get("steps"),
        count=fields.get("n", 1),
        limits=limits,
    )


def _request(prompt, size, seed, steps, count, limits: Limits) -> GenerationRequest:
    if not isinstance(prompt, str):
        raise bad(BAD_PROMPT, "'prompt' is required and must be a string")
    prompt, cleaned = clean_text(prompt)
    if not prompt.strip():
        raise bad(BAD_PROMPT, "'prompt' is empty")
    width, height = size
    if not (limits.min_side <= width <= limits.max_side and limits.min_side <= height <= limits.max_side):
        raise bad(BAD_SIZE, f"size {width}x{height} is outside {limits.min_side}..{limits.max_side} per side")
    if width * height > limits.max_pixels:
        raise bad(BAD_SIZE, f"size {width}x{height} has more than {limits.max_pixels} pixels")
    count = _integer(count, "n", BAD_COUNT)
    if not 1 <= count <= limits.max_images:
        raise bad(BAD_COUNT, f"n must be 1..{limits.max_images}, got {count}")
    if seed is None:
        seed = secrets.randbelow(2**31)
    seed = _integer(seed, "seed", BAD_SEED)
    if not 0 <= seed < 2**32:
        raise bad(BAD_SEED, f"seed must be 0..{2**32 - 1}, got {seed}")
    if steps is not None:
        steps = _integer(steps, "steps", BAD_STEPS)
        if not 1 <= steps <= limits.max_steps:
            raise bad(BAD_STEPS, f"steps must be 1..{limits.max_steps}, got {steps}")
    return GenerationRequest(prompt, cleaned, width, height, seed, steps, count)


def _size(text) -> tuple[int, int]:
    try:
        return parse_size(text)
    except ValueError as error:
        raise bad(BAD_SIZE, str(error)) from error


def _integer(value, name: str, code: int) -> int:
    """Integers, or strings of digits (the pipeline format sends every value as a string)."""
    if isinstance(value, bool):
        raise bad(code, f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 12:
        return int(value.strip())
    raise bad(code, f"{name} must be an integer, got {str(value)[:20]!r}")


def pipeline_reply(
    images_b64: list[str],
    used_prompt: str,
    truncated: bool,
    tokens: int,
    seed: int,
    width: int,
    height: int,
    cleaned: bool,
    logid=None,
) -> dict:
    keys = ["image"] * len(images_b64) + [
        "truncated",
        "prompt_tokens",
        "used_prompt",
        "seed",
        "width",
        "height",
        "prompt_cleaned",
    ]
    values = list(images_b64) + [
        str(truncated).lower(),
        str(tokens),
        used_prompt,
        str(seed),
        str(width),
        str(height),
        str(cleaned).lower(),
    ]
    reply = {"err_no": 0, "err_msg": "", "key": keys, "value": values}
    if logid is not None:
        reply["logid"] = logid
    return reply


def pipeline_error(error: ApiError, logid=None) -> dict:
    reply = {"err_no": error.code, "err_msg": error.message, "key": [], "value": []}
    if logid is not None:
        reply["logid"] = logid
    return reply


def openai_reply(
    images_b64: list[str], used_prompt: str, truncated: bool, tokens: int, seed: int, cleaned: bool, created: int
) -> dict:
    return {
        "created": created,
        "data": [{"b64_json": image, "revised_prompt": used_prompt} for image in images_b64],
        # Extensions beyond OpenAI's schema; a client that does not know them ignores them.
        "truncated": truncated,
        "prompt_cleaned": cleaned,
        "seed": seed,
        "usage": {"input_tokens": tokens},
    }


def openai_error(error: ApiError) -> dict:
    kind = "invalid_request_error" if error.http_status < 500 else "server_error"
    return {"error": {"message": error.message, "type": kind, "code": error.code}}
