"""The landing sensor's job runs one batch's ingest and its scoring, nothing else: no training, no XGBoost, no Ray
search."""

import dagster as dg

from dgx_assets.definitions import defs as code_location
from dgx_assets.defs.ingest.sensors import ingest_batch_job, landing_zone_sensor

defs = code_location()


def test_ingest_batch_selects_exactly_one_batch_s_ingest_and_scoring_with_their_checks():
    graph = defs.resolve_asset_graph()
    assets = ingest_batch_job.selection.resolve(graph)
    checks = ingest_batch_job.selection.resolve_checks(graph)
    names = {"raw_images", "image_features", "defect_predictions", "review_queue"}
    assert assets == {dg.AssetKey(name) for name in names}
    expected_checks = {key for key in graph.asset_check_keys if key.asset_key in assets}
    assert checks == expected_checks and {key.name for key in checks} >= {"valid_image_share", "embedding_drift"}
    assert landing_zone_sensor.job_name == "ingest_batch"
    # The job as the code location resolves it: partitioned by batch, built from the same selection.
    job = defs.resolve_job_def("ingest_batch")
    assert job.partitions_def is not None and job.partitions_def.name == "image_batches"
