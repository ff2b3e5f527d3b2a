"""The client Spark executors use to call ERNIE-Image serving endpoints over HTTP.

- One pooled client per Python worker (`get_client`), so keep-alive connections are reused across
  tasks and batches; urllib3's pool is thread-safe, so a task's threads share it.
- Both wire formats: `openai` (POST /v1/images/generations, as SGLang serves the real ERNIE-Image) and
  `pipeline` (Paddle Serving's POST /<service>/prediction). Bodies are built with `json`, so quotes,
  backslashes, newlines and Chinese arrive intact.
- Several endpoints, one per GPU: round-robin, skipping endpoints whose /status is not "ready" and
  endpoints whose circuit breaker is open; a breaker opens after repeated failures and lets one probe
  through after a cool-down.
- Bounded retries with exponential backoff and jitter (urllib3's `Retry` keeps the count, the history and
  the backoff) for connection errors, timeouts, 5xx and 503, pipeline errors in the 6000 (timeout) and
  9000 (inference) ranges, and `bad_reply`: an answer that does not parse into what the protocol promises
  (wrong JSON types, missing fields). Each retry picks the next endpoint, which is why the loop is ours
  and not urllib3's (its retries stay on one host). 4xx / 5000-range answers are the request's fault and
  are not retried.
- A total deadline per request and per /status probe: urllib3's read timeout applies to each socket
  read, so a server dripping one byte at a time would hold a request for as long as it drips. Every
  read of a response gets only what is left of the deadline (`_DeadlineResponse`).
- TLS: certificates verified against `ca_bundle` (or the system store) unless `verify_tls` is off; TLS 1.2
  at least.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, cast

import urllib3
import urllib3.connection
from pydantic import BaseModel, ConfigDict, Field, field_validator
from urllib3.util.retry import Retry

PROTOCOLS = ("openai", "pipeline")
RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
BAD_REPLY = "bad_reply"


class ClientBehaviour(BaseModel):
    """How executors call the endpoints, declared once: the `ernie` resource subclasses this, so the launchpad
    shows these fields, defaults and descriptions."""

    model_config = ConfigDict(frozen=True)

    protocol: str = Field(
        default="openai",
        description="'openai' (/v1/images/generations, SGLang) or 'pipeline' (Paddle Serving /<service>/prediction)",
    )
    service_name: str = Field(default="ernie_image", description="pipeline protocol: the route, /<service_name>/prediction")
    model_name: str = Field(
        default="ernie-image", description="openai protocol: the `model` field (SGLang answers for the model it serves)"
    )
    concurrency: int = Field(default=4, ge=1, description="Requests in flight per Spark task")
    connect_timeout_s: float = Field(default=3.0, gt=0, description="The longest wait for a connection to an endpoint")
    read_timeout_s: float = Field(default=120.0, gt=0, description="The longest silence between two reads of a reply")
    request_deadline_s: float = Field(
        default=300.0,
        gt=0,
        description="The longest one image request may take in all, however slowly the endpoint answers; "
        "then it is retried elsewhere",
    )
    status_deadline_s: float = Field(default=5.0, gt=0, description="The longest one /status probe may take in all")
    ca_bundle: Optional[str] = Field(
        default=None, description="PEM file of the CAs that sign https endpoints' certificates; None: the system's CAs"
    )
    verify_tls: bool = Field(
        default=True,
        description="Verify https endpoints' certificates (TLS 1.2 at least either way); turn off only for a test endpoint",
    )
    max_retries: int = Field(default=3, ge=0, description="Tries after the first, per image, each on the next endpoint")
    backoff_s: float = Field(default=0.25, ge=0, description="Wait before the first retry; it doubles per retry, with jitter")
    breaker_threshold: int = Field(default=3, ge=1, description="Consecutive failures that open an endpoint's circuit breaker")
    breaker_cooldown_s: float = Field(
        default=10.0, ge=0, description="How long an open breaker keeps an endpoint out before one probe is let through"
    )

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        if value not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {value!r}")
        return value


class ClientSettings(ClientBehaviour):
    """Everything one client needs: the behaviour above, the endpoints, and what the resource resolved."""

    endpoints: tuple[str, ...] = Field(min_length=1, description="Base URLs of the serving endpoints")
    token: Optional[str] = Field(default=None, repr=False)
    backoff_max_s: float = 5.0
    status_ttl_s: float = 5.0  # how long an endpoint's /status answer is trusted
    num_inference_steps: Optional[int] = None

    @field_validator("endpoints")
    @classmethod
    def _without_trailing_slash(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(url.rstrip("/") for url in urls)


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


class _Retryable(Exception):
    pass


class _BadReply(_Retryable):
    """The endpoint answered 200, but not with what the protocol promises."""

    def __init__(self, problem: str):
        super().__init__(f"{BAD_REPLY}: {problem}")


class _Rejected(Exception):
    pass


class Endpoint:
    """An endpoint's circuit breaker and readiness, shared by all threads of the worker."""

    def __init__(self, url: str):
        self.url = url
        self.lock = threading.Lock()
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False
        self.ready: bool | None = None
        self.status_note = ""
        self.status_at = 0.0
        self.last_error = ""
        self.requests = 0
        self.errors = 0

    def breaker_state(self, now: float, cooldown: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now - self.opened_at >= cooldown else "open"

    def success(self) -> None:
        with self.lock:
            self.failures, self.opened_at, self.probing = 0, None, False
            self.requests += 1

    def failure(self, message: str, threshold: int) -> None:
        with self.lock:
            self.requests += 1
            self.errors += 1
            self.failures += 1
            self.last_error = message
            # A failed probe re-opens at once; otherwise open after `threshold` failures in a row.
            if self.probing or self.failures >= threshold:
                self.opened_at = time.monotonic()
            self.probing = False


class ErnieClient:
    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self.endpoints = [Endpoint(url) for url in settings.endpoints]
        self._next = 0
        self._pick_lock = threading.Lock()
        headers = {"Content-Type": "application/json", "User-Agent": "dgx-assets-ernie-client"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        self._headers = headers
        self._pool = urllib3.PoolManager(
            num_pools=len(self.endpoints) + 2,
            maxsize=max(2, settings.concurrency),
            retries=False,
            timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=settings.read_timeout_s),
            cert_reqs="CERT_REQUIRED" if settings.verify_tls else "CERT_NONE",
            ca_certs=settings.ca_bundle,
            ssl_minimum_version=ssl.TLSVersion.TLSv1_2,
        )
        self._pool.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        # The retry budget and backoff of one image; `increment` returns a new Retry per failed try.
        self._retry = Retry(
            total=settings.max_retries,
            backoff_factor=settings.backoff_s,
            backoff_max=settings.backoff_max_s,
            backoff_jitter=settings.backoff_s,
            allowed_methods=None,
        )

    # --- public -----------------------------------------------------------------------------------------
    def generate(self, prompt: str, width: int, height: int, seed: int) -> ImageReply:
        """One image, with retries across endpoints. Never raises for service trouble: the reply says."""
        s = self.settings
        retry, tries, kind = self._retry, 0, "unavailable"
        while True:
            endpoint = self._pick()
            if endpoint is None:
                problem: Exception = _Retryable("no endpoint available (" + self.describe_endpoints() + ")")
                url, kind = None, "unavailable"
            else:
                tries += 1
                started = time.monotonic()
                try:
                    payload, truncated, used = self._call(endpoint.url, prompt, width, height, seed)
                except _Rejected as error:
                    endpoint.success()  # it answered: the request was wrong, not the endpoint
                    return ImageReply(endpoint=endpoint.url, tries=tries, error=str(error), error_kind="rejected")
                except _Retryable as error:
                    endpoint.failure(str(error), s.breaker_threshold)
                    problem, url, kind = error, endpoint.url, BAD_REPLY if isinstance(error, _BadReply) else "unavailable"
                else:
                    endpoint.success()
                    return ImageReply(payload, truncated, used, endpoint.url, time.monotonic() - started, tries)
            try:
                retry = retry.increment(method="POST", url=url, error=problem)
            except urllib3.exceptions.MaxRetryError:
                break
            time.sleep(retry.get_backoff_time())
        history = [f"{item.url}: {item.error}" if item.url else str(item.error) for item in retry.history]
        history.append(f"{url}: {problem}" if url else str(problem))
        return ImageReply(
            tries=tries, error=f"gave up after {s.max_retries + 1} tries: {'; '.join(history[-3:])}", error_kind=kind
        )

    def generate_many(self, requests: list[tuple[str, int, int, int]]) -> list[ImageReply]:
        """Several images with up to `concurrency` requests in flight, replies in request order."""
        if len(requests) <= 1 or self.settings.concurrency <= 1:
            return [self.generate(*request) for request in requests]
        with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(requests))) as pool:
            return list(pool.map(lambda request: self.generate(*request), requests))

    def describe_endpoints(self) -> str:
        now = time.monotonic()
        parts = []
        for endpoint in self.endpoints:
            state = endpoint.breaker_state(now, self.settings.breaker_cooldown_s)
            note = f"breaker {state}" if state != "closed" else ("ready" if endpoint.ready else endpoint.status_note)
            if endpoint.last_error and state != "closed":
                note += f", last error: {endpoint.last_error[:120]}"
            parts.append(f"{endpoint.url} {note}")
        return "; ".join(parts)

    def stats(self) -> dict:
        return {
            e.url: {
                "requests": e.requests,
                "errors": e.errors,
                "breaker": e.breaker_state(time.monotonic(), self.settings.breaker_cooldown_s),
            }
            for e in self.endpoints
        }

    # --- endpoint choice -----------------------------------------------------------------------------
    def _pick(self) -> Endpoint | None:
        """The next usable endpoint in round-robin order, or None when every one is down or not ready."""
        count = len(self.endpoints)
        with self._pick_lock:
            start = self._next
            self._next = (self._next + 1) % count
        for offset in range(count):
            endpoint = self.endpoints[(start + offset) % count]
            if self._usable(endpoint):
                return endpoint
        return None

    def _usable(self, endpoint: Endpoint) -> bool:
        now = time.monotonic()
        with endpoint.lock:
            state = endpoint.breaker_state(now, self.settings.breaker_cooldown_s)
            if state == "open" or (state == "half-open" and endpoint.probing):
                return False
            if state == "half-open":
                endpoint.probing = True  # this caller is the one probe; others wait for its outcome
                endpoint.status_at = 0.0  # and it re-reads /status first
            fresh = now - endpoint.status_at < self.settings.status_ttl_s
        if not fresh:
            self._refresh_status(endpoint)
        if not endpoint.ready and endpoint.probing:
            with endpoint.lock:
                endpoint.probing = False
        return bool(endpoint.ready)

    def _refresh_status(self, endpoint: Endpoint) -> None:
        try:
            response = self._request("GET", f"{endpoint.url}/status", self.settings.status_deadline_s)
            try:
                answer = json.loads(response.data) if response.data else None
            except ValueError:
                answer = None
            status = answer.get("status") if isinstance(answer, dict) else None
            # A server without /status (e.g. some real deployments) is taken as ready if it answers.
            ready = status == "ready" or (response.status == 404)
            note = f"status {status or response.status}"
        except urllib3.exceptions.HTTPError as error:
            ready, note = False, f"unreachable ({_short(error)})"
            endpoint.failure(f"/status {note}", self.settings.breaker_threshold)
        with endpoint.lock:
            endpoint.ready, endpoint.status_note, endpoint.status_at = ready, note, time.monotonic()

    def _request(self, method: str, url: str, deadline_s: float, **options) -> urllib3.BaseHTTPResponse:
        """One HTTP exchange that ends within `deadline_s`, however slowly the server answers."""
        s = self.settings
        _DEADLINE.at = time.monotonic() + deadline_s
        try:
            return self._pool.request(
                method,
                url,
                headers=self._headers,
                timeout=urllib3.Timeout(connect=min(s.connect_timeout_s, deadline_s), read=min(s.read_timeout_s, deadline_s)),
                **options,
            )
        except urllib3.exceptions.HTTPError as error:
            if time.monotonic() >= _DEADLINE.at:
                raise urllib3.exceptions.TimeoutError(f"no complete reply within the {deadline_s:g}s deadline") from error
            raise
        finally:
            _DEADLINE.at = None

    # --- wire formats ----------------------------------------------------------------------------------
    def _call(self, url: str, prompt: str, width: int, height: int, seed: int) -> tuple[str, bool, str]:
        s = self.settings
        if s.protocol == "openai":
            body = {
                "model": s.model_name,
                "prompt": prompt,
                "size": f"{width}x{height}",
                "n": 1,
                "seed": seed,
                "response_format": "b64_json",
            }
            if s.num_inference_steps:
                body["num_inference_steps"] = s.num_inference_steps
            return _openai_image(self._post(f"{url}/v1/images/generations", body), prompt)
        keys = ["prompt", "width", "height", "seed"]
        values = [prompt, str(width), str(height), str(seed)]
        if s.num_inference_steps:
            keys.append("steps")
            values.append(str(s.num_inference_steps))
        return _pipeline_image(self._post(f"{url}/{s.service_name}/prediction", {"key": keys, "value": values}), prompt)

    def _post(self, url: str, body: dict) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            response = self._request("POST", url, self.settings.request_deadline_s, body=data)
        except urllib3.exceptions.HTTPError as error:  # refused, reset, timed out, past the deadline, protocol error
            raise _Retryable(f"{type(error).__name__}: {_short(error)}") from None
        try:
            reply = json.loads(response.data) if response.data else {}
        except ValueError:  # not JSON, or not UTF-8
            reply = None
        if response.status != 200:
            message = f"HTTP {response.status}: {_error_message(reply) or response.data[:200]!r}"
            if response.status in RETRYABLE_STATUS or response.status >= 500:
                raise _Retryable(message)
            raise _Rejected(message)
        if not isinstance(reply, dict):
            raise _BadReply(f"the reply is not a JSON object: {response.data[:80]!r}")
        return reply


# --- replies: what each protocol promises, checked field by field ----------------------------------------


def _openai_image(reply: dict, prompt: str) -> tuple[str, bool, str]:
    """(base64 image, truncated, prompt used) from `{"data": [{"b64_json": str, "revised_prompt": str?}], "truncated": bool?}`."""
    data = reply.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise _BadReply(f"`data` is {_shown(data)}, not a list of image objects")
    item = data[0]
    payload = cast(str, _typed(item, "b64_json", str, "data[0]."))  # required: _typed raised if missing
    revised = _typed(item, "revised_prompt", str, "data[0].", optional=True)
    truncated = _typed(reply, "truncated", bool, optional=True)
    return payload, bool(truncated), revised or prompt


def _pipeline_image(reply: dict, prompt: str) -> tuple[str, bool, str]:
    """(base64 image, truncated, prompt used) from Paddle Serving's `{"err_no": int, "err_msg": str, "key": [str],
    "value": [str]}`, or the error it reports."""
    err_no = _typed(reply, "err_no", int, optional=True) or 0
    err_msg = _typed(reply, "err_msg", str, optional=True) or ""
    if err_no:
        message = f"err_no {err_no}: {err_msg}"[:300]
        raise (_Rejected if 5000 <= err_no < 6000 else _Retryable)(message)
    keys, values = reply.get("key"), reply.get("value")
    if not (
        isinstance(keys, list)
        and isinstance(values, list)
        and len(keys) == len(values)
        and all(isinstance(item, str) for item in keys + values)
    ):
        raise _BadReply(f"`key` {_shown(keys)} and `value` {_shown(values)} are not two lists of strings of one length")
    fields = dict(zip(keys, values))
    if "image" not in fields:
        raise _BadReply("the pipeline reply has no 'image' key")
    return fields["image"], fields.get("truncated") == "true", fields.get("used_prompt", prompt)


def _typed(mapping: dict, name: str, kind: type, where: str = "", optional: bool = False):
    value = mapping.get(name)
    if value is None and optional:
        return None
    # bool is an int to Python, not to JSON: `"err_no": true` is no error code.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _BadReply(f"{where}{name} is {_shown(value)}, not {'a string' if kind is str else kind.__name__}")
    return value


def _shown(value) -> str:
    return "missing" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"


# --- a total deadline under urllib3 --------------------------------------------------------------------------

_DEADLINE = threading.local()  # `at`: the monotonic time the current thread's request must end by


class _DeadlineReader(io.RawIOBase):
    """The socket under one HTTP response: each read waits at most for what is left of the deadline."""

    def __init__(self, sock, deadline: float):
        # A socket file of its own keeps the descriptor open after http.client closes the connection of a
        # response that ends it (`Connection: close`), as http.client's own file does.
        self._raw, self._sock, self._deadline = sock.makefile("rb", buffering=0), sock, deadline
        self._read_timeout = sock.gettimeout()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline has passed")
        self._sock.settimeout(left if self._read_timeout is None else min(left, self._read_timeout))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response, reading its status line, headers and body through a `_DeadlineReader`."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        deadline = getattr(_DEADLINE, "at", None)
        if deadline is not None:
            self.fp.close()  # the plain socket file http.client made, replaced by one that keeps the deadline
            self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


class _HTTPConnection(urllib3.connection.HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    response_class = _DeadlineResponse


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection  # pyright: ignore[reportAssignmentType]  # urllib3's Protocol stub, not its class


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection  # pyright: ignore[reportAssignmentType]  # urllib3's Protocol stub, not its class


def _error_message(reply) -> str:
    if not isinstance(reply, dict):
        return ""
    if isinstance(reply.get("error"), dict):
        return str(reply["error"].get("message", ""))[:300]
    return str(reply.get("err_msg", ""))[:300]


def _short(error: Exception) -> str:
    reason = getattr(error, "reason", None) or error
    return str(reason)[:160]


_CLIENTS: dict[tuple, ErnieClient] = {}
_CLIENTS_LOCK = threading.Lock()


def get_client(settings: ClientSettings) -> ErnieClient:
    """The client of this Python worker for these settings, created on first use and then reused."""
    key = (os.getpid(), settings)  # a forked worker must not share its parent's sockets
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = ErnieClient(settings)
        return client


def parse_endpoints(text: str) -> tuple[str, ...]:
    """`DGX_ERNIE_ENDPOINTS`-style list: comma-separated base URLs."""
    urls = tuple(part.strip().rstrip("/") for part in text.split(",") if part.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    return urls
