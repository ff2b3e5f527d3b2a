"""Serving processes for the length of a `with` block, as the serving tests start them."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from dgx_assets.generation.launcher import start_local_servers, stop_servers


@contextmanager
def local_servers(count: int, model_dir: str | Path, **options):
    servers = start_local_servers(count, model_dir, **options)
    try:
        yield servers
    finally:
        stop_servers(servers)
