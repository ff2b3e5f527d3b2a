"""ernie_generated_images' checks through Dagster, against an endpoint of the tests' own (tests/generation/rogue.py):
an unusable prompts-table row is its own warning, the blocking share judges the images of the prompts that could
be sent, row ids stay the same from run to run, and a failing blocking check says what to fix in its description."""

from __future__ import annotations

import csv

import dagster as dg
import pytest
from rogue import RogueServer
from support.lake_tables import read_rows

from dgx_assets.defs.generation.assets import ernie_generated_images
from dgx_assets.defs.generation.checks import generation_checks
from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.resources import LakeResource

ONE_TRY = {"backoff_s": 0.01, "max_retries": 0, "breaker_threshold": 100}


@pytest.fixture
def rogue():
    server = RogueServer()
    yield server
    server.stop()


def write_prompts(path, rows) -> str:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "prompt", "width", "height", "seed"])
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def materialize(resources, max_attempts: int = 3):
    return dg.materialize(
        [ernie_generated_images, *generation_checks],
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
        run_config={"ops": {"ernie_generated_images": {"config": {"max_attempts": max_attempts}}}},
    )


def ids_in(lake_root) -> list:
    return sorted((row["id"] for row in read_rows(lake_root, "ernie_generated_images")), key=str)


def test_an_empty_prompt_is_its_own_warning_and_ids_stay_the_same(tmp_path, spark_resource, rogue):
    rows = [{"id": f"p{i}", "prompt": f"defective cell {i}", "width": 32, "height": 32, "seed": i} for i in range(6)]
    rows += [
        {"id": "", "prompt": "a cell without an id", "width": 32, "height": 32, "seed": 6},
        {"id": "empty", "prompt": "", "width": 32, "height": 32, "seed": 7},
    ]
    lake_root = tmp_path / "lake"
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(lake_root), prompts=write_prompts(tmp_path / "p.csv", rows)),
        "ernie": ErnieServingResource(endpoints=rogue.url, **ONE_TRY),
    }
    result = materialize(resources)
    assert result.success  # before: 7/8 < 0.9 on the blocking check failed the run
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    share = checks["generated_images_valid"]
    assert share.passed and share.metadata["valid_share"].value == 1.0 and share.metadata["prompts_sent"].value == 7
    prompts = checks["generated_prompts_valid"]
    assert not prompts.passed and prompts.severity == dg.AssetCheckSeverity.WARN
    assert "1 row(s) of the prompts table cannot be sent" in prompts.description
    assert "empty: the prompt is empty" in prompts.description
    first = ids_in(lake_root)
    assert None not in first and any(str(i).startswith("row-") for i in first)

    again = materialize(resources)  # every valid row is kept: its id must not change (before: None)
    assert again.asset_materializations_for_node("ernie_generated_images")[0].metadata["reused_from_previous"].value == 7
    assert ids_in(lake_root) == first


def test_a_failing_blocking_check_says_what_it_found_and_what_to_fix(tmp_path, spark_resource, rogue):
    rows = [{"id": f"p{i}", "prompt": f"cell {i}", "width": 32, "height": 32, "seed": i} for i in range(4)]
    rogue.script = [("json", {"data": [{"b64_json": 1}]})] * 2  # two of four prompts get a bad reply
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(tmp_path / "lake"), prompts=write_prompts(tmp_path / "p.csv", rows)),
        "ernie": ErnieServingResource(endpoints=rogue.url, **ONE_TRY),
    }
    result = materialize(resources, max_attempts=1)
    share = {e.check_name: e for e in result.get_asset_check_evaluations()}["generated_images_valid"]
    assert not share.passed
    assert share.description.startswith("2 of the 4 prompts that could be sent have a valid image")
    assert "'bad_reply': 2" in share.description
    assert "`bad_reply` that they answered" in share.metadata["to_fix"].value  # the report and the demo read it


def _generated_table(lake_root, contents: list[bytes]) -> None:
    """Valid rows of ernie_generated_images (the columns the checks read), committed as the asset commits them."""
    import pyarrow as pa
    from support.lake_tables import commit_rows

    ids = [f"p{index:02d}" for index in range(len(contents))]
    rows = pa.table({"id": ids, "status": ["valid"] * len(ids), "content": contents, "file_name": [f"{i}.png" for i in ids]})
    commit_rows(lake_root, "ernie_generated_images", rows)


def _diversity(lake_root):
    from dgx_assets.defs.generation.checks import generated_images_diverse

    # The check alone, as "Execute check" runs it on the table in the lake.
    job = dg.Definitions(
        assets=[dg.AssetSpec("ernie_generated_images")],
        asset_checks=[generated_images_diverse],
        resources={"lake": LakeResource(root=str(lake_root))},
    ).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def test_near_duplicate_images_are_flagged_and_real_cells_are_not(tmp_path):
    import numpy as np
    from support.training_data import elpv_raw_rows, png, synthetic_cell

    # Twelve captures of one cell under sensor noise: decodable, and of no use as twelve training images.
    rng = np.random.default_rng(3)
    cell = synthetic_cell(rng, defective=True, size=96).astype(float)
    copies = [png(np.clip(cell + rng.normal(0, 3, cell.shape), 0, 255).astype(np.uint8)) for _ in range(12)]
    _generated_table(tmp_path / "copies", copies)
    flagged = _diversity(tmp_path / "copies")
    assert not flagged.passed and flagged.severity == dg.AssetCheckSeverity.WARN
    assert flagged.metadata["mean_pairwise_distance"].value < 0.05 and flagged.metadata["min_mean_pairwise_distance"].value == 0.1
    assert flagged.description.startswith("The generated images are near-duplicates")
    assert "build-generator" in flagged.metadata["to_fix"].value

    # Twelve real, different ELPV cells: the same measure finds them varied.
    _generated_table(tmp_path / "elpv", list(elpv_raw_rows(count=12, batch="x")["content"]))
    varied = _diversity(tmp_path / "elpv")
    assert varied.passed and varied.metadata["mean_pairwise_distance"].value > 0.2
    assert varied.metadata["images_compared"].value == 12 and "| p" in varied.metadata["closest_pairs"].value
