"""The scripts inside the deployment files, run for real: the Triton init fetch and the Dockerfiles' pinned install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.deploy_files import (
    REPO,
    dockerfile,
    find,
    pod_spec,
)


def _run_triton_fetch(lake_root: Path, destination: Path) -> subprocess.CompletedProcess:
    [fetch] = pod_spec(find("Deployment", "triton"))["initContainers"]
    assert fetch["command"] == ["python", "-c"]
    script, _ = fetch["args"]
    return subprocess.run(
        [sys.executable, "-c", script, str(destination)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DGX_LAKE_ROOT": str(lake_root)},
    )


def test_triton_init_container_copies_the_edge_model_export_from_the_lake(tmp_path):
    from dgx_assets.edge.config import EdgeModelConfig
    from dgx_assets.edge.triton import SAVEDMODEL_DIRNAME, TensorSignature, triton_config

    name = EdgeModelConfig().triton_model_name
    model_dir = tmp_path / "lake" / "edge_model" / "triton" / name
    savedmodel = model_dir / "1" / SAVEDMODEL_DIRNAME
    (savedmodel / "variables").mkdir(parents=True)
    (savedmodel / "saved_model.pb").write_bytes(b"graph")
    (savedmodel / "variables" / "variables.index").write_bytes(b"index")
    config = triton_config(
        name,
        [TensorSignature("image", "uint8", [None, 48, 48, 1])],
        [TensorSignature("probabilities", "float32", [None, 2])],
        8,
        "labels.txt",
    )
    (model_dir / "config.pbtxt").write_text(config)
    (model_dir / "labels.txt").write_text("functional\ndefective\n")
    destination = tmp_path / "models"
    destination.mkdir()

    result = _run_triton_fetch(tmp_path / "lake", destination)

    assert result.returncode == 0, result.stderr
    copied = {str(p.relative_to(destination)) for p in destination.rglob("*") if p.is_file()}
    assert copied == {
        f"{name}/config.pbtxt",
        f"{name}/labels.txt",
        f"{name}/1/{SAVEDMODEL_DIRNAME}/saved_model.pb",
        f"{name}/1/{SAVEDMODEL_DIRNAME}/variables/variables.index",
    }
    assert (destination / name / "config.pbtxt").read_text() == config


def test_triton_init_container_says_what_is_missing(tmp_path):
    (tmp_path / "lake").mkdir()
    result = _run_triton_fetch(tmp_path / "lake", tmp_path)
    assert result.returncode != 0
    assert "materialize edge_model first" in result.stderr


# Each image installs its deployable's extra and nothing else (pyproject.toml).
IMAGE_EXTRAS = {"code-location": "core", "serving": "serving", "edge-runtime": "edge"}


@pytest.mark.parametrize("name", sorted(IMAGE_EXTRAS))
def test_dockerfile_installs_exactly_its_extra_at_the_pinned_versions(name):
    """Runs the Dockerfile's requirements one-liner against pyproject.toml, as `docker build` would."""
    import shlex
    import tomllib

    [run] = [line for line in dockerfile(name).splitlines() if line.startswith("RUN python -c")]
    command = shlex.split(run.removeprefix("RUN ").rstrip(" \\"))
    result = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True, check=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"][IMAGE_EXTRAS[name]]
    wanted = [d for d in extra if not (name == "serving" and d.startswith("paddlepaddle"))]
    assert result.stdout.split() == wanted
    # Every install in the image honours the lock, which the build copies in beside pyproject.toml.
    installs = [line for line in dockerfile(name).splitlines() if "pip install" in line]
    assert installs and all("pip install -c constraints.txt " in line for line in installs), installs
    assert "COPY pyproject.toml constraints.txt ./" in dockerfile(name)
    if name == "edge-runtime":
        return
    # GPU builds as the `gpu` extra pins them: Paddle for serving, TensorFlow's CUDA libraries for the rest.
    gpu_pin = next(
        d
        for d in project["optional-dependencies"]["gpu"]
        if d.startswith("paddlepaddle-gpu" if name == "serving" else "tensorflow")
    )
    assert f'"{gpu_pin}"' in dockerfile(name)
