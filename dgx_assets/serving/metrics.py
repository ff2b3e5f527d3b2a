"""Prometheus metrics of the serving process, through prometheus-client.

One registry per server (not the library's global one), holding the process collector too (CPU, resident
memory, open file descriptors), so /metrics shows what an abusive client costs the process. Route labels
are a fixed set (openai, pipeline, status, metrics, other): a client cannot mint new series by URL.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # the *_created series double the page and nothing here reads them
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        self.requests = Counter(
            "ernie_serving_requests", "HTTP requests by route and status code.", ("route", "code"), registry=registry
        )
        self.errors = Counter(
            "ernie_serving_errors", "Failed requests by error code (pipeline err_no).", ("code",), registry=registry
        )
        self.latency = Histogram(
            "ernie_serving_request_duration_seconds",
            "Time from request head to reply.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge("ernie_serving_in_flight", "Requests being handled now.", registry=registry)
        self.queued = Gauge("ernie_serving_queued", "Generation requests waiting for a predictor.", registry=registry)
        self.connections = Gauge("ernie_serving_connections", "Open client connections.", registry=registry)
        self.images = Counter("ernie_serving_images", "Images generated.", registry=registry)
        self.truncated = Counter("ernie_serving_prompts_truncated", "Prompts cut to the model's token limit.", registry=registry)
        self.closed = Counter(
            "ernie_serving_connections_closed",
            "Connections the server closed on a limit, by reason.",
            ("reason",),
            registry=registry,
        )
        self.model_ready = Gauge("ernie_serving_model_ready", "1 when the model is loaded and serving.", registry=registry)

    def finished(self, route: str, status: int, seconds: float, error_code: int | None) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        if error_code is not None:
            self.errors.labels(str(error_code)).inc()

    def generated(self, images: int, truncated: bool) -> None:
        self.images.inc(images)
        if truncated:
            self.truncated.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
