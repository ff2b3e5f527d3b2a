"""defect_predictions on a real lake: real ELPV images, a real trained_model registered in a real MLflow store, the
alias `champion`, Spark scoring a production batch that landed without labels."""

import hashlib
import io
import json

import dagster as dg
import numpy as np
import pytest
from mlflow import MlflowClient
from PIL import Image
from support.code_location import code_location_with

from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.demo_seed import PRODUCTION_BATCH, seed_landing
from dgx_assets.ingest import images
from dgx_assets.lake.store import Lake
from dgx_assets.partitions import image_batches
from dgx_assets.production.scoring import PREDICTIONS_TABLE
from dgx_assets.training.dataset import FeatureFiles, scan_features

pytest.importorskip("elpv_dataset")

SIZE = 48
SMALL = {
    "ops": {
        "image_features": {"config": {"image_height": SIZE, "image_width": SIZE}},
        "trained_model": {
            "config": {"epochs": 2, "warmup_epochs": 1, "patience": 2, "batch_size": 16, "min_margin_over_baseline": -1.0}
        },
    }
}
keys = lambda *names: [dg.AssetKey(name) for name in names]  # noqa: E731


@pytest.fixture
def line(tmp_path, spark_resource):
    root = tmp_path / "lake"
    counts = seed_landing(str(root / "landing"), batches=1, limit=160, production_share=0.25)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resources = {
        "spark": spark_resource,
        "lake": LakeResource(root=str(root)),
        "mlflow": MlflowResource(tracking_uri=tracking_uri),
        "ernie": ErnieServingResource(endpoints="http://127.0.0.1:9/", build_if_missing=False),  # never called here
    }
    return code_location_with(resources), Lake(str(root)), tracking_uri, counts


def run(defs, instance, selection, partition=None):
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(instance=instance, asset_selection=selection, partition_key=partition, run_config=SMALL)


def test_a_production_batch_is_kept_scored_by_the_champion_and_never_trained_on(line):
    defs, lake, tracking_uri, counts = line
    assert counts == {"elpv-01": 120, PRODUCTION_BATCH: 40}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, list(counts))
        for batch in counts:
            assert run(defs, instance, keys("raw_images", "image_features"), batch).success

        # Production images are valid rows with their bytes, split `unlabelled`, featurised like the others...
        raw = lake.tables.scan("raw_images", ["batch", "status", "label", "split", "content"]).to_pylist()
        production = [row for row in raw if row["batch"] == PRODUCTION_BATCH]
        assert len(production) == 40 and all(row["status"] == images.VALID and row["content"] for row in production)
        assert {(row["label"], row["split"]) for row in production} == {(None, images.UNLABELLED)}
        # ... and no training split or class counts them.
        index = scan_features(FeatureFiles.of_snapshot(lake.tables.snapshot("image_features")))
        assert index.class_names == ("defective", "functional")
        assert sum(index.rows(split) for split in ("train", "validation", "test")) == 120

        # Before any champion: the step says so in one line and writes nothing.
        assert run(defs, instance, keys("trained_model")).success
        before = run(defs, instance, keys("defect_predictions"), PRODUCTION_BATCH)
        assert before.success and not before.asset_materializations_for_node("defect_predictions")
        logged = [event.message for event in instance.all_logs(before.run_id) if event.message]
        assert any(message == "no champion yet: run champion_model" for message in logged)
        assert lake.tables.table(PREDICTIONS_TABLE) is None

        client = MlflowClient(tracking_uri)
        name = "dgx_defect_classifier"
        version = client.get_model_version_by_alias(name, "candidate").version
        client.set_registered_model_alias(name, "champion", version)  # what champion_model does when gates pass
        scored = run(defs, instance, keys("defect_predictions"), PRODUCTION_BATCH)
        metadata = scored.asset_materializations_for_node("defect_predictions")[0].metadata
        # Drawn like the training images (the same deal of ELPV): no drift, with the figures that say so.
        (drift,) = [e for e in scored.get_asset_check_evaluations() if e.check_name == "embedding_drift"]
        assert drift.passed and drift.severity == dg.AssetCheckSeverity.WARN, drift.description
        assert drift.metadata["max_roc_auc"].value == 0.55 and 0.01 <= drift.metadata["p_value"].value <= 1
        assert drift.metadata["model_version"].value == f"dgx_defect_classifier v{version}"
        queued = run(defs, instance, keys("review_queue"), PRODUCTION_BATCH)
        queue = queued.asset_materializations_for_node("review_queue")[0].metadata

    rows = lake.tables.scan(
        PREDICTIONS_TABLE, ["sha256", "label", "defect_probability", "predicted_label", "threshold", "model_version"]
    )
    rows = rows.to_pylist()
    assert len(rows) == 40 and {row["model_version"] for row in rows} == {str(version)}
    assert all(row["label"] is None for row in rows)
    assert metadata["dagster/row_count"].value == 40 and metadata["production_images"].value == 40
    assert metadata["model_version"].value == f"{name} v{version}"
    assert metadata["snapshot_id"].value == str(lake.tables.table(PREDICTIONS_TABLE).current_snapshot().snapshot_id)
    assert "| 0.0–0.1 |" in metadata["defect_probability_histogram"].value

    # The same images through trained_model's own Keras file give the same probabilities, and the same decision.
    import keras

    model = keras.models.load_model(lake.fs_path(lake.uri("trained_model", "model.keras")), compile=False)
    features = lake.tables.scan("image_features", ["sha256", "batch", "tensor", "tensor_shape"]).to_pylist()
    tensors = {
        r["sha256"]: np.frombuffer(r["tensor"], np.uint8).reshape(r["tensor_shape"])
        for r in features
        if r["batch"] == PRODUCTION_BATCH
    }
    order = [row["sha256"] for row in rows]
    expected = np.asarray(model(np.stack([tensors[s] for s in order]).astype(np.float32), training=False))[:, 0]
    got = np.array([row["defect_probability"] for row in rows])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    threshold = rows[0]["threshold"]
    cut = threshold if threshold is not None else 0.5
    assert [row["predicted_label"] for row in rows] == ["defective" if p >= cut else "functional" for p in got]

    # The queue: the 20 production images nearest the threshold, least sure first, each with its Grad-CAM picture.
    assert queue["tasks"].value == 20 and queue["production_images"].value == 40
    folder = queue["path"].value
    tasks = json.loads(lake.read_bytes(f"{folder}/tasks.json"))
    margins = [task["predictions"][0]["score"] for task in tasks]
    by_sha = {row["sha256"]: row["defect_probability"] for row in rows}
    assert margins == sorted(margins) and len(tasks) == 20
    assert margins[-1] <= min(abs(p - cut) for sha, p in by_sha.items() if sha not in {t["data"]["sha256"] for t in tasks})
    for task in tasks:
        sha = task["data"]["sha256"]
        assert task["data"]["image"].startswith("http://") and task["data"]["saliency"].endswith(f"/saliency/{sha}.png")
        picture = Image.open(io.BytesIO(lake.read_bytes(f"{folder}/saliency/{sha}.png")))
        assert picture.format == "PNG" and picture.size == (SIZE, SIZE)
        assert hashlib.sha256(lake.read_bytes(f"{folder}/images/{sha}.png")).hexdigest() == sha
