"""The client Spark executors use to call ERNIE-Image serving endpoints over HTTP.

- One pooled client per Python worker (`get_client`), so keep-alive connections are reused across
  tasks and batches; urllib3's pool is thread-safe, so a task's threads share it.
- Both wire formats: `openai` (POST /v1/images/generations, as SGLang serves the real ERNIE-Image) and
  `pipeline` (Paddle Serving's POST /<service>/prediction). Bodies are built with `json`, so quotes,
  backslashes, newlines and Chinese arrive intact.
- Several endpoints, one per GPU: round-robin, skipping endpoints whose /status is not "ready" and
  endpoints whose circuit breaker is open; a breaker opens after repeated failures and lets one probe
  through after a cool-down.
- Bounded retries with exponential backoff and jitter for connection errors, timeouts, 5xx and 503,
  and pipeline errors in the 6000 (timeout) and 9000 (inference) ranges. 4xx / 5000-range answers are
  the request's fault and are not retried.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import urllib3

PROTOCOLS = ("openai", "pipeline")
RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class ClientSettings:
    endpoints: tuple[str, ...]
    protocol: str = "openai"
    service: str = "ernie_image"  # pipeline route name
    model: str = "ernie-image"  # OpenAI `model` field (SGLang answers for the model it serves)
    token: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 120.0
    max_retries: int = 3  # tries after the first, per image
    backoff_s: float = 0.25
    backoff_max_s: float = 5.0
    breaker_threshold: int = 3  # consecutive failures that open an endpoint's breaker
    breaker_cooldown_s: float = 10.0
    status_ttl_s: float = 5.0  # how long an endpoint's /status answer is trusted
    concurrency: int = 4  # requests in flight per task
    num_inference_steps: int | None = None

    def __post_init__(self):
        if not self.endpoints:
            raise ValueError("no ERNIE-Image endpoints given")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        object.__setattr__(self, "endpoints", tuple(url.rstrip("/") for url in self.endpoints))


@dataclass
class ImageReply:
    """One image request's outcome. `error_kind`: unavailable | rejected | None."""

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
        self._random = random.Random()
        headers = {"Content-Type": "application/json", "User-Agent": "dgx-assets-ernie-client"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        self._headers = headers
        self._pool = urllib3.PoolManager(
            num_pools=len(self.endpoints) + 2, maxsize=max(2, settings.concurrency), retries=False,
            timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=settings.read_timeout_s))

    # --- public -----------------------------------------------------------------------------------------
    def generate(self, prompt: str, width: int, height: int, seed: int) -> ImageReply:
        """One image, with retries across endpoints. Never raises for service trouble: the reply says."""
        s = self.settings
        tries, problems = 0, []
        for attempt in range(s.max_retries + 1):
            endpoint = self._pick()
            if endpoint is None:
                problems.append("no endpoint available (" + self.describe_endpoints() + ")")
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
                    problems.append(f"{endpoint.url}: {error}")
                else:
                    endpoint.success()
                    return ImageReply(payload, truncated, used, endpoint.url, time.monotonic() - started, tries)
            if attempt < s.max_retries:
                time.sleep(self._backoff(attempt))
        summary = "; ".join(problems[-3:])
        return ImageReply(tries=tries, error=f"gave up after {s.max_retries + 1} tries: {summary}",
                          error_kind="unavailable")

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
        return {e.url: {"requests": e.requests, "errors": e.errors, "breaker": e.breaker_state(
            time.monotonic(), self.settings.breaker_cooldown_s)} for e in self.endpoints}

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
            response = self._pool.request("GET", f"{endpoint.url}/status", headers=self._headers,
                                          timeout=urllib3.Timeout(connect=self.settings.connect_timeout_s,
                                                                  read=self.settings.connect_timeout_s))
            status = json.loads(response.data).get("status") if response.data else None
            # A server without /status (e.g. some real deployments) is taken as ready if it answers.
            ready = status == "ready" or (response.status == 404)
            note = f"status {status or response.status}"
        except (urllib3.exceptions.HTTPError, ValueError, AttributeError) as error:
            ready, note = False, f"unreachable ({type(error).__name__})"
            endpoint.failure(f"/status {note}", self.settings.breaker_threshold)
        with endpoint.lock:
            endpoint.ready, endpoint.status_note, endpoint.status_at = ready, note, time.monotonic()

    def _backoff(self, attempt: int) -> float:
        base = min(self.settings.backoff_max_s, self.settings.backoff_s * 2**attempt)
        return base * self._random.uniform(0.5, 1.5)  # jitter: many tasks must not retry in lockstep

    # --- wire formats ----------------------------------------------------------------------------------
    def _call(self, url: str, prompt: str, width: int, height: int, seed: int) -> tuple[str, bool, str]:
        s = self.settings
        if s.protocol == "openai":
            body = {"model": s.model, "prompt": prompt, "size": f"{width}x{height}", "n": 1, "seed": seed,
                    "response_format": "b64_json"}
            if s.num_inference_steps:
                body["num_inference_steps"] = s.num_inference_steps
            reply = self._post(f"{url}/v1/images/generations", body)
            try:
                item = reply["data"][0]
                return item["b64_json"], bool(reply.get("truncated", False)), item.get("revised_prompt") or prompt
            except (KeyError, IndexError, TypeError):
                raise _Retryable("reply has no data[0].b64_json") from None
        keys = ["prompt", "width", "height", "seed"]
        values = [prompt, str(width), str(height), str(seed)]
        if s.num_inference_steps:
            keys.append("steps")
            values.append(str(s.num_inference_steps))
        reply = self._post(f"{url}/{s.service}/prediction", {"key": keys, "value": values})
        err_no = reply.get("err_no", 0)
        if err_no:
            message = f"err_no {err_no}: {reply.get('err_msg', '')}"[:300]
            raise (_Rejected if 5000 <= err_no < 6000 else _Retryable)(message)
        fields = dict(zip(reply.get("key") or [], reply.get("value") or []))
        if "image" not in fields:
            raise _Retryable("pipeline reply has no 'image' key")
        return fields["image"], fields.get("truncated") == "true", fields.get("used_prompt", prompt)

    def _post(self, url: str, body: dict) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            response = self._pool.request("POST", url, body=data, headers=self._headers)
        except urllib3.exceptions.HTTPError as error:  # refused, reset, timed out, protocol error
            raise _Retryable(f"{type(error).__name__}: {_short(error)}") from None
        try:
            reply = json.loads(response.data) if response.data else {}
        except ValueError:
            reply = {}
        if response.status != 200:
            message = f"HTTP {response.status}: {_error_message(reply) or response.data[:200]!r}"
            if response.status in RETRYABLE_STATUS or response.status >= 500:
                raise _Retryable(message)
            raise _Rejected(message)
        if not isinstance(reply, dict):
            raise _Retryable("reply is not a JSON object")
        return reply


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
