"""ernie_generated_images through Dagster: local serving processes launched for the run, reuse of earlier
results, the blocking check, and a clear failure when no endpoint is up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from support.lake_tables import read_rows

from dgx_assets import settings
from dgx_assets.defs.generation.assets import ernie_generated_images
from dgx_assets.defs.generation.checks import generated_images_valid
from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.resources import LakeResource
from dgx_assets.generation.prompts import write_demo_prompts

FAST_CLIENT = dict(backoff_s=0.05, max_retries=1, breaker_cooldown_s=30.0)


def materialize(resources: dict, run_config: dict | None = None, with_check: bool = True):
    assets = [ernie_generated_images] + ([generated_images_valid] if with_check else [])
    return dg.materialize(
        assets, resources=resources, instance=dg.DagsterInstance.ephemeral(), run_config=run_config or {}, raise_on_error=False
    )


def table_rows(lake_root: Path) -> list[dict]:
    return [
        {key: value for key, value in row.items() if key != "content"} for row in read_rows(lake_root, "ernie_generated_images")
    ]


def server_pids_in_logs() -> set[int]:
    pids = set()
    for log in (settings.environment().state_dir / "serving-logs").rglob("*.log"):
        pids |= {int(pid) for pid in re.findall(r"pid=(\d+)\]", log.read_text(errors="replace"))}
    return pids


def test_definitions_have_the_asset_and_its_blocking_check():
    asset = ernie_generated_images
    spec = next(iter(asset.specs))
    assert spec.group_name == "generation" and set(spec.kinds) == {"spark", "paddle"}
    assert spec.owners and spec.code_version and spec.description
    check = next(iter(generated_images_valid.check_specs))
    assert check.blocking is True


def test_importing_the_definitions_loads_no_paddle_spark_or_tensorflow():
    code = (
        "import sys, dgx_assets.defs.generation.assets, dgx_assets.defs.generation.checks; "
        "print(sorted(m for m in ('paddle', 'pyspark', 'tensorflow', 'great_expectations') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=settings.repo_root())
    assert result.stdout.strip() == "[]"


def test_local_mode_launches_two_servers_generates_and_stops_them(tmp_path, spark_resource, quick_model, monkeypatch):
    monkeypatch.setenv("DGX_ERNIE_ENDPOINTS", "local")
    lake_root = tmp_path / "lake"
    prompts = write_demo_prompts(str(tmp_path / "prompts.csv"), width=64, height=64)
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(lake_root), prompts=prompts),
        "ernie": ErnieServingResource(model_dir=str(quick_model), build_if_missing=False),
    }

    result = materialize(resources)
    assert result.success
    rows = table_rows(lake_root)
    assert len(rows) == 12 and {row["status"] for row in rows} == {"valid"}
    assert len({row["endpoint"] for row in rows}) == 2  # both launched instances did work
    metadata = result.asset_materializations_for_node("ernie_generated_images")[0].metadata
    png_folder = Path(metadata["png_folder"].value.removeprefix("file://"))  # this run's, named by its snapshot
    assert png_folder.parent == lake_root / "ernie_generated_images" / "png"
    assert sorted(p.name for p in png_folder.iterdir()) == sorted(row["file_name"] for row in rows)
    assert all(row["png_path"] == (png_folder / row["file_name"]).as_uri() for row in rows)
    assert metadata["status_counts"].value == {"valid": 12} and metadata["reused_from_previous"].value == 0
    check = result.get_asset_check_evaluations()[0]
    assert check.passed and check.metadata["status_counts"].value == {"valid": 12}

    pids = server_pids_in_logs()
    assert len(pids) == 2
    for pid in pids:  # stopped by PID at the end of the run
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    # Again, nothing changed: every row is reused, no server is needed for it ...
    again = materialize(resources, with_check=False)
    metadata = again.asset_materializations_for_node("ernie_generated_images")[0].metadata
    assert again.success and metadata["reused_from_previous"].value == 12
    # ... unless told to redo all, here through the Paddle Serving pipeline protocol.
    resources["ernie"] = ErnieServingResource(model_dir=str(quick_model), build_if_missing=False, protocol="pipeline")
    redo = materialize(resources, {"ops": {"ernie_generated_images": {"config": {"redo_all": True}}}}, with_check=False)
    metadata = redo.asset_materializations_for_node("ernie_generated_images")[0].metadata
    assert redo.success and metadata["reused_from_previous"].value == 0 and metadata["protocol"].value == "pipeline"


def test_all_endpoints_down_fails_with_a_clear_message_and_rows_say_why(tmp_path, spark_resource, dead_url):
    lake_root = tmp_path / "lake"
    prompts = write_demo_prompts(str(tmp_path / "prompts.csv"), width=32, height=32)
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(lake_root), prompts=prompts),
        "ernie": ErnieServingResource(endpoints=f"{dead_url},{dead_url}/", **FAST_CLIENT),
    }
    result = materialize(resources)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
    assert "No image could be generated for any of the 12 prompts" in message
    assert "DGX_ERNIE_ENDPOINTS" in message
    rows = table_rows(lake_root)
    assert len(rows) == 12 and {row["status"] for row in rows} == {"failed"}
    assert all("gave up" in row["error"] and row["attempts"] == 3 for row in rows)


def test_blocking_check_fails_below_the_valid_share(tmp_path, spark_resource, fleet):
    lake_root = tmp_path / "lake"
    prompts = tmp_path / "prompts.csv"
    prompts.write_text(
        'id,prompt,width,height\nok1,"defective, mono",32,32\nok2,poly,32,32\nempty,,32,32\nhuge,cell,100000,32\n',
        encoding="utf-8",
    )
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(lake_root), prompts=str(prompts)),
        "ernie": ErnieServingResource(endpoints=fleet["a"].url, **FAST_CLIENT),
    }
    result = materialize(resources)
    check = result.get_asset_check_evaluations()[0]
    assert not check.passed
    assert check.metadata["status_counts"].value == {"valid": 2, "rejected": 1, "invalid_prompt": 1}
    assert "2 of the 3 prompts that could be sent" in check.description  # the invalid one has its own check
    rows = {row["id"]: row for row in table_rows(lake_root)}
    assert "outside" in rows["huge"]["error"] and rows["huge"]["attempts"] == 1  # refused, not retried


def test_missing_prompts_file_is_a_clear_failure(tmp_path, spark_resource):
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(tmp_path / "lake"), prompts=str(tmp_path / "nope.csv")),
        "ernie": ErnieServingResource(endpoints="http://127.0.0.1:9"),
    }
    result = materialize(resources, with_check=False)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "Could not read the prompts table" in failure.step_failure_data.error.message + str(
        failure.step_failure_data.user_failure_data
    )
