"""`pip install '.[edge]'` alone runs `dgx-assets edge-run`: no TensorFlow, Paddle, Spark or Dagster installed or imported.

A clean venv, a non-editable install of this checkout with the lock (constraints.txt), and the real console script
on real PNGs with a real int8 .tflite model (built here, in the test environment, which has TensorFlow).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dgx_assets.station.runtime import EdgeClassifier, classify_folder

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
# Distributions (normalised names) that must not reach an inspection station, and their import names.
NOT_INSTALLED = ("tensorflow", "paddlepaddle", "pyspark", "dagster", "mlflow", "great-expectations")
NOT_IMPORTED = ("tensorflow", "paddle", "pyspark", "dagster", "mlflow", "great_expectations", "pydantic")
EDGE_EXTRA = ("ai-edge-litert", "numpy", "pillow", "uvicorn", "starlette")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(command: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory) -> Path:
    """A fresh venv holding `<this checkout>[edge]` (installed from a copy, so the build leaves the repo alone)."""
    root = tmp_path_factory.mktemp("edge_install")
    source = root / "src"
    source.mkdir()
    shutil.copy2(REPO / "pyproject.toml", source)
    shutil.copytree(REPO / "dgx_assets", source / "dgx_assets", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = root / "venv"
    started = time.perf_counter()
    _run([sys.executable, "-m", "venv", venv], timeout=120).check_returncode()
    install = _run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "-c", REPO / "constraints.txt", f"{source}[edge]"],
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    print(f"edge venv installed in {time.perf_counter() - started:.1f} s")
    return venv


@pytest.fixture(scope="module")
def station_images(edge_dataset, tmp_path_factory) -> Path:
    contents, labels = edge_dataset.select("test")
    folder = tmp_path_factory.mktemp("station")
    for i, (content, label) in enumerate(zip(contents[:24], labels[:24])):
        (folder / f"{i:03d}-{label}.png").write_bytes(content)
    return folder


def test_edge_extra_installs_the_edge_runtime_and_nothing_of_the_platform(edge_venv):
    listing = _run(
        [
            edge_venv / "bin" / "python",
            "-c",
            "import importlib.metadata as m, json; print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))",
        ],
        timeout=60,
    )
    installed = {_normalise(name) for name in json.loads(listing.stdout)}
    for name in EDGE_EXTRA:
        assert name in installed, f"{name} is missing from the edge install: {sorted(installed)}"
    unwanted = sorted(n for n in installed if any(n == bad or n.startswith(f"{bad}-") for bad in NOT_INSTALLED))
    assert unwanted == [], f"the edge extra installed {unwanted}"


def test_edge_run_classifies_a_folder_with_only_the_edge_extra(edge_venv, edge_model_dir, station_images):
    # -X importtime: the interpreter lists every module the real console script imported, on stderr.
    command = [edge_venv / "bin" / "python", "-X", "importtime", edge_venv / "bin" / "dgx-assets", "edge-run"]
    started = time.perf_counter()
    result = _run([*command, "--model-dir", edge_model_dir, "--images", station_images], timeout=300, cwd=edge_venv)
    print(f"edge-run in the edge venv: {time.perf_counter() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-4000:]

    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in result.stderr.splitlines() if "|" in line}
    assert {"ai_edge_litert", "numpy", "PIL", "dgx_assets"} <= imported
    assert sorted(imported & set(NOT_IMPORTED)) == []

    lines = [json.loads(line) for line in result.stdout.splitlines()]
    expected = list(classify_folder(EdgeClassifier(edge_model_dir), station_images))  # the full install, in process
    assert [r["file"] for r in lines] == [r["file"] for r in expected] and len(lines) == 24
    assert [r["label"] for r in lines] == [r["label"] for r in expected]
    correct = sum(r["label"] == r["file"].split("-", 1)[1].removesuffix(".png") for r in lines)
    assert correct / len(lines) >= 0.8


def test_other_commands_say_the_edge_install_lacks_them(edge_venv):
    result = _run([edge_venv / "bin" / "dgx-assets", "serve", "--help"], timeout=60)
    assert result.returncode == 2
    assert "edge runtime only" in result.stderr and "Traceback" not in result.stderr
