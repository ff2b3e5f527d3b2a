"""What a generation client is told: how executors call the endpoints (`ClientBehaviour`, which the `ernie`
resource shows on the launchpad) and, for one client, the endpoints and what the resource resolved
(`ClientSettings`)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

PROTOCOLS = ("openai", "pipeline")


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


def parse_endpoints(text: str) -> tuple[str, ...]:
    """`DGX_ERNIE_ENDPOINTS`-style list: comma-separated base URLs."""
    urls = tuple(part.strip().rstrip("/") for part in text.split(",") if part.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    return urls
