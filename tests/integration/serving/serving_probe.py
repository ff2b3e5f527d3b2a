"""What the serving tests share: route paths, the limits of the hostile-probe server, /metrics reading."""

from __future__ import annotations

import requests

OPENAI = "/v1/images/generations"
PIPELINE = "/ernie_image/prediction"

# Tight limits for the hostile-client tests: one inference thread held 300 ms per request, one request may
# wait, and slow or idle clients are cut off after a second or two.
LIMITED = {
    "latency_ms": 300,
    "max_queue": 1,
    "max_connections": 60,
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "keep_alive_s": 2.0,
}


def metric_samples(url: str, headers=None, verify: bool | str = True) -> dict:
    """{(name, frozenset(labels)): value} from /metrics, read with prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics", headers=headers, timeout=5, verify=verify).text
    return {
        (s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples
    }


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)
