"""The client Spark executors use to call ERNIE-Image serving endpoints over HTTP.

- One pooled client per Python worker (`get_client`), so keep-alive connections are reused across
  tasks and batches; urllib3's pool is thread-safe, so a task's threads share it.
- Both wire formats: `openai` (POST /v1/images/generations, as SGLang serves the real ERNIE-Image) and
  `pipeline` (Paddle Serving's POST /<service>/prediction). Bodies are built with `json`, so quotes,
  backslashes, newlines and Chinese arrive intact.
- Several endpoints, one per GPU: round-robin, skipping endpoints whose /status is not "ready" and
  endpoints whose circuit breaker is open; a breaker opens after repeated failures and lets one probe
  through after a cool-down (`breaker.py`).
- Bounded retries with exponential backoff and jitter (urllib3's `Retry` keeps the count, the history and
  the backoff) for connection errors, timeouts, 5xx and 503, pipeline errors in the 6000 (timeout) and
  9000 (inference) ranges, and `bad_reply`: an answer that does not parse into what the protocol promises
  (wrong JSON types, missing fields; `replies.py`). Each retry picks the next endpoint, which is why the
  loop is ours and not urllib3's (its retries stay on one host). 4xx / 5000-range answers are the request's
  fault and are not retried.
- A total deadline per request and per /status probe: urllib3's read timeout applies to each socket
  read, so a server dripping one byte at a time would hold a request for as long as it drips. Every
  read of a response gets only what is left of the deadline (`deadline.py`).
- Settings: `client_settings.py`.
- TLS: certificates verified against `ca_bundle` (or the system store) unless `verify_tls` is off; TLS 1.2
  at least.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import urllib3
from urllib3.util.retry import Retry

from dgx_assets.generation.breaker import Endpoint
from dgx_assets.generation.client_settings import ClientSettings
from dgx_assets.generation.deadline import DEADLINE, HTTPPool, HTTPSPool
from dgx_assets.generation.replies import (
    BAD_REPLY,
    BadReply,
    ImageReply,
    Rejected,
    Retryable,
    error_message,
    openai_image,
    pipeline_image,
)

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


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
        self._pool.pool_classes_by_scheme = {"http": HTTPPool, "https": HTTPSPool}
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
                problem: Exception = Retryable("no endpoint available (" + self.describe_endpoints() + ")")
                url, kind = None, "unavailable"
            else:
                tries += 1
                started = time.monotonic()
                try:
                    payload, truncated, used = self._call(endpoint.url, prompt, width, height, seed)
                except Rejected as error:
                    endpoint.success()  # it answered: the request was wrong, not the endpoint
                    return ImageReply(endpoint=endpoint.url, tries=tries, error=str(error), error_kind="rejected")
                except Retryable as error:
                    endpoint.failure(str(error), s.breaker_threshold)
                    problem, url, kind = error, endpoint.url, BAD_REPLY if isinstance(error, BadReply) else "unavailable"
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
        DEADLINE.at = time.monotonic() + deadline_s
        try:
            return self._pool.request(
                method,
                url,
                headers=self._headers,
                timeout=urllib3.Timeout(connect=min(s.connect_timeout_s, deadline_s), read=min(s.read_timeout_s, deadline_s)),
                **options,
            )
        except urllib3.exceptions.HTTPError as error:
            if time.monotonic() >= DEADLINE.at:
                raise urllib3.exceptions.TimeoutError(f"no complete reply within the {deadline_s:g}s deadline") from error
            raise
        finally:
            DEADLINE.at = None

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
            return openai_image(self._post(f"{url}/v1/images/generations", body), prompt)
        keys = ["prompt", "width", "height", "seed"]
        values = [prompt, str(width), str(height), str(seed)]
        if s.num_inference_steps:
            keys.append("steps")
            values.append(str(s.num_inference_steps))
        return pipeline_image(self._post(f"{url}/{s.service_name}/prediction", {"key": keys, "value": values}), prompt)

    def _post(self, url: str, body: dict) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            response = self._request("POST", url, self.settings.request_deadline_s, body=data)
        except urllib3.exceptions.HTTPError as error:  # refused, reset, timed out, past the deadline, protocol error
            raise Retryable(f"{type(error).__name__}: {_short(error)}") from None
        try:
            reply = json.loads(response.data) if response.data else {}
        except ValueError:  # not JSON, or not UTF-8
            reply = None
        if response.status != 200:
            message = f"HTTP {response.status}: {error_message(reply) or response.data[:200]!r}"
            if response.status in RETRYABLE_STATUS or response.status >= 500:
                raise Retryable(message)
            raise Rejected(message)
        if not isinstance(reply, dict):
            raise BadReply(f"the reply is not a JSON object: {response.data[:80]!r}")
        return reply


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
