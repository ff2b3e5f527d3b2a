"""What an image request comes back as (`ImageReply`), and the replies of both wire formats checked field by
field against what the protocol promises: an answer that does not parse into it is a `bad_reply`, retried on
the next endpoint like an unavailable one; a refusal of the request itself is not retried."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

BAD_REPLY = "bad_reply"


@dataclass
class ImageReply:
    """One image request's outcome. `error_kind`: unavailable | rejected | bad_reply | None."""

    payload_b64: str | None = None
    truncated: bool = False
    used_prompt: str | None = None
    endpoint: str | None = None
    latency_s: float | None = None
    tries: int = 0
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Retryable(Exception):
    pass


class BadReply(Retryable):
    """The endpoint answered 200, but not with what the protocol promises."""

    def __init__(self, problem: str):
        super().__init__(f"{BAD_REPLY}: {problem}")


class Rejected(Exception):
    pass


def openai_image(reply: dict, prompt: str) -> tuple[str, bool, str]:
    """(base64 image, truncated, prompt used) from `{"data": [{"b64_json": str, "revised_prompt": str?}], "truncated": bool?}`."""
    data = reply.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise BadReply(f"`data` is {_shown(data)}, not a list of image objects")
    item = data[0]
    payload = cast(str, _typed(item, "b64_json", str, "data[0]."))  # required: _typed raised if missing
    revised = _typed(item, "revised_prompt", str, "data[0].", optional=True)
    truncated = _typed(reply, "truncated", bool, optional=True)
    return payload, bool(truncated), revised or prompt


def pipeline_image(reply: dict, prompt: str) -> tuple[str, bool, str]:
    """(base64 image, truncated, prompt used) from Paddle Serving's `{"err_no": int, "err_msg": str, "key": [str],
    "value": [str]}`, or the error it reports."""
    err_no = _typed(reply, "err_no", int, optional=True) or 0
    err_msg = _typed(reply, "err_msg", str, optional=True) or ""
    if err_no:
        message = f"err_no {err_no}: {err_msg}"[:300]
        raise (Rejected if 5000 <= err_no < 6000 else Retryable)(message)
    keys, values = reply.get("key"), reply.get("value")
    if not (
        isinstance(keys, list)
        and isinstance(values, list)
        and len(keys) == len(values)
        and all(isinstance(item, str) for item in keys + values)
    ):
        raise BadReply(f"`key` {_shown(keys)} and `value` {_shown(values)} are not two lists of strings of one length")
    fields = dict(zip(keys, values))
    if "image" not in fields:
        raise BadReply("the pipeline reply has no 'image' key")
    return fields["image"], fields.get("truncated") == "true", fields.get("used_prompt", prompt)


def error_message(reply) -> str:
    """The message an error reply of either protocol carries, bounded in length; "" when it carries none."""
    if not isinstance(reply, dict):
        return ""
    if isinstance(reply.get("error"), dict):
        return str(reply["error"].get("message", ""))[:300]
    return str(reply.get("err_msg", ""))[:300]


def _typed(mapping: dict, name: str, kind: type, where: str = "", optional: bool = False):
    value = mapping.get(name)
    if value is None and optional:
        return None
    # bool is an int to Python, not to JSON: `"err_no": true` is no error code.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadReply(f"{where}{name} is {_shown(value)}, not {'a string' if kind is str else kind.__name__}")
    return value


def _shown(value) -> str:
    return "missing" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"
