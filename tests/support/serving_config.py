"""What an operator config file sets, read the way `build_config` reads it, for the config tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgx_assets.serving.config import _read_file, _validated


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings a config file sets, validated, by field name (only those it sets)."""
    given = _read_file(path)
    config = _validated(given)
    return {name: getattr(config, name) for name in given}
