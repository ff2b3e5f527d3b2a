"""Prometheus metrics of the serving process, kept in memory and written in the text exposition format."""

from __future__ import annotations

import threading
from collections import Counter

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (route, http status) -> count
        self.errors: Counter = Counter()  # error code -> count
        self.buckets: dict[str, list[int]] = {}
        self.latency_sum: Counter = Counter()
        self.latency_count: Counter = Counter()
        self.in_flight = 0
        self.images = 0
        self.truncated = 0

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, route: str, status: int, seconds: float, error_code: int | None) -> None:
        with self._lock:
            self.in_flight -= 1
            self.requests[(route, status)] += 1
            if error_code is not None:
                self.errors[error_code] += 1
            counts = self.buckets.setdefault(route, [0] * len(LATENCY_BUCKETS))
            for index, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    counts[index] += 1
            self.latency_sum[route] += seconds
            self.latency_count[route] += 1

    def generated(self, images: int, truncated: bool) -> None:
        with self._lock:
            self.images += images
            self.truncated += int(truncated)

    def render(self, model_state: str) -> str:
        with self._lock:
            lines = [
                "# HELP ernie_serving_requests_total HTTP requests by route and status code.",
                "# TYPE ernie_serving_requests_total counter",
                *(f'ernie_serving_requests_total{{route="{r}",code="{s}"}} {n}'
                  for (r, s), n in sorted(self.requests.items())),
                "# HELP ernie_serving_errors_total Failed requests by error code (pipeline err_no or HTTP status).",
                "# TYPE ernie_serving_errors_total counter",
                *(f'ernie_serving_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())),
                "# HELP ernie_serving_request_duration_seconds Time from request read to reply.",
                "# TYPE ernie_serving_request_duration_seconds histogram",
            ]
            for route, counts in sorted(self.buckets.items()):
                lines += [f'ernie_serving_request_duration_seconds_bucket{{route="{route}",le="{b}"}} {c}'
                          for b, c in zip(LATENCY_BUCKETS, counts)]
                lines += [
                    f'ernie_serving_request_duration_seconds_bucket{{route="{route}",le="+Inf"}} '
                    f'{self.latency_count[route]}',
                    f'ernie_serving_request_duration_seconds_sum{{route="{route}"}} {self.latency_sum[route]:.6f}',
                    f'ernie_serving_request_duration_seconds_count{{route="{route}"}} {self.latency_count[route]}',
                ]
            lines += [
                "# HELP ernie_serving_in_flight Requests being handled now.",
                "# TYPE ernie_serving_in_flight gauge",
                f"ernie_serving_in_flight {self.in_flight}",
                "# HELP ernie_serving_images_total Images generated.",
                "# TYPE ernie_serving_images_total counter",
                f"ernie_serving_images_total {self.images}",
                "# HELP ernie_serving_prompts_truncated_total Prompts cut to the model's token limit.",
                "# TYPE ernie_serving_prompts_truncated_total counter",
                f"ernie_serving_prompts_truncated_total {self.truncated}",
                "# HELP ernie_serving_model_ready 1 when the model is loaded and serving.",
                "# TYPE ernie_serving_model_ready gauge",
                f"ernie_serving_model_ready {int(model_state == 'ready')}",
            ]
        return "\n".join(lines) + "\n"
