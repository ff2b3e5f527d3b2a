"""The deployables install and load apart: the code location loads without the serving stack, edge commands
without the code location (tests/integration/edge/test_edge_install.py installs the edge extra alone)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVING_STACK = ("paddle", "uvicorn", "starlette", "prometheus_client", "h11")


def _imported_by(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO, timeout=300)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_code_location_loads_without_paddle_or_the_serving_stack():
    """What the webserver, the daemon and each sensor tick do: import the module and resolve its definitions."""
    imported = _imported_by(
        "import dgx_assets.definitions as d\ndefs = d.defs()\ndefs.resolve_asset_graph()\ndefs.resolve_all_job_defs()"
    )
    assert "dagster" in imported
    assert sorted(imported & set(SERVING_STACK)) == []


def test_edge_commands_load_nothing_of_the_code_location_or_the_serving_process():
    imported = _imported_by(
        "from dgx_assets import cli\ntry:\n    cli.main(['edge-run', '--help'])\nexcept SystemExit:\n    pass"
    )
    heavy = ("tensorflow", "paddle", "pyspark", "dagster", "mlflow", "pydantic", "great_expectations", "pyarrow")
    assert sorted(imported & set(heavy)) == []
