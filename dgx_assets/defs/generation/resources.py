"""ErnieServingResource: where the ERNIE-Image endpoints are, and the client settings executors use.

`endpoints` defaults to DGX_ERNIE_ENDPOINTS, read when the resource initialises: comma-separated base
URLs of running servers (the bundled one, or a real ERNIE-Image behind SGLang with protocol "openai"),
or `local` to launch the bundled serving process for the run: `local_instances` processes on free
loopback ports, stopped by PID when the asset is done. Importing this module imports neither paddle nor
pyspark.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import dagster as dg
from pydantic import Field

from dgx_assets import settings
from dgx_assets.config_parts import part_of
from dgx_assets.generation import launcher
from dgx_assets.generation.client_settings import ClientBehaviour, ClientSettings, parse_endpoints
from dgx_assets.progress import log_progress

LOCAL = "local"
TOKEN_VARIABLE = "ERNIE_SERVING_TOKEN"  # how a launched local server receives the token


def default_model_dir() -> Path:
    return settings.environment().state_dir / "ernie_generator"


class ErnieServingResource(dg.ConfigurableResource, ClientBehaviour):
    """ERNIE-Image serving endpoints (DGX_ERNIE_ENDPOINTS, or `local`) and how executors call them."""

    endpoints: Optional[str] = Field(
        default=None, description="comma-separated URLs, or 'local'; None reads DGX_ERNIE_ENDPOINTS (default local)"
    )
    token: Optional[str] = Field(
        default=None, description="bearer token; None reads DGX_ERNIE_TOKEN (the Kubernetes secret deploy/ hands to run pods)"
    )
    # Local mode: the bundled server.
    local_instances: int = 2
    model_dir: Optional[str] = Field(default=None, description="generator for local mode; default .dgx/ernie_generator")
    build_if_missing: bool = Field(
        default=True, description="local mode: train the generator first if absent (a few minutes on a CPU)"
    )
    gpu_ids: Optional[str] = Field(default=None, description="local mode: e.g. '0,1' pins one server per GPU")
    startup_timeout_s: float = 180.0
    tasks: int = Field(default=0, description="Spark tasks to spread prompts over; 0 = one per endpoint (min 2)")

    def _connection(self) -> tuple[str, Optional[str], str]:
        """The endpoints, the token and the deployment: the fields left None taken from the environment now
        (DGX_ERNIE_ENDPOINTS, DGX_ERNIE_TOKEN), the one place this resource reads it."""
        env = settings.environment()
        return (self.endpoints or env.ernie_endpoints).strip(), self.token or env.token, env.deployment

    @property
    def is_local(self) -> bool:
        return self._connection()[0].lower() == LOCAL

    @property
    def local_model_dir(self) -> Path:
        return Path(self.model_dir) if self.model_dir else default_model_dir()

    def generator_to_build(self) -> Optional[Path]:
        """The local generator a run of this resource would have to train first, if any."""
        if not (self.is_local and self.build_if_missing):
            return None
        return self.local_model_dir if launcher.missing_model_files(self.local_model_dir) else None

    def client_settings(self, urls: tuple[str, ...]) -> ClientSettings:
        return ClientSettings(
            endpoints=urls,
            token=self._connection()[1],
            **part_of(self, ClientBehaviour).model_dump(),
        )

    def task_count(self, urls: tuple[str, ...]) -> int:
        return self.tasks or max(2, len(urls))

    @contextlib.contextmanager
    def serving(self, log=None) -> Iterator[tuple[str, ...]]:
        """The endpoint URLs for this run; in local mode the servers live exactly as long as the block."""
        say = log.info if log is not None else (lambda message: None)
        endpoints, token, deployment = self._connection()
        if endpoints.lower() != LOCAL:
            urls = parse_endpoints(endpoints)
            say(f"ERNIE-Image endpoints: {', '.join(urls)} ({self.protocol})")
            yield urls
            return
        if deployment != "local" and log is not None:
            log.warning(
                "DGX_ERNIE_ENDPOINTS=local starts the servers on this host's loopback: executors on other "
                "hosts cannot reach them. On a cluster, list the serving URLs in DGX_ERNIE_ENDPOINTS."
            )
        model_dir = self.local_model_dir
        if self.generator_to_build():
            log_progress(
                say,
                f"No generator in {model_dir} yet: training one now, or waiting for the build under way (minutes on a CPU)",
                "phase",
                phase="building the local generator (minutes on a CPU)",
            )
            launcher.ensure_generator(model_dir)
        env = dict(os.environ)
        options: dict = {
            "log_dir": settings.environment().state_dir / "serving-logs",
            "env": env,
            "timeout_s": self.startup_timeout_s,
        }
        extra = ["--service-name", self.service_name]
        if token:
            env[TOKEN_VARIABLE] = token
            options["token_env"] = TOKEN_VARIABLE
        gpu_ids = [int(x) for x in self.gpu_ids.split(",") if x.strip()] if self.gpu_ids else None
        servers = launcher.start_local_servers(self.local_instances, model_dir, gpu_ids=gpu_ids, extra_args=extra, **options)
        launched = ", ".join(f"{server.url} (pid {server.pid})" for server in servers)
        log_progress(say, f"Launched local ERNIE-Image serving processes: {launched}", "phase", phase="generating images")
        try:
            yield tuple(server.url for server in servers)
        finally:
            launcher.stop_servers(servers)
            say("Stopped local serving processes: " + ", ".join(str(server.pid) for server in servers))


# The ERNIE-Image endpoints (DGX_ERNIE_ENDPOINTS), or a serving process launched beside the run.
@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={"ernie": ErnieServingResource()})
