"""The lineage graph says what each asset reads, and the jobs select what they always selected."""

import dagster as dg

from dgx_assets.definitions import defs as code_location
from dgx_assets.defs.ingest.sensors import ingest_batch_job
from dgx_assets.demo import demo_selection

defs = code_location()


def _names(keys) -> set[str]:
    return {key.to_user_string() for key in keys}


def test_trained_model_declares_the_search_it_may_read():
    graph = defs.resolve_asset_graph()
    assert _names(graph.get(dg.AssetKey("trained_model")).parent_keys) == {"image_features", "hyperparameter_search"}
    assert "trained_model" in _names(graph.get(dg.AssetKey("hyperparameter_search")).child_keys)


def test_make_demo_leaves_the_optional_search_out_and_still_trains():
    per_batch, production, whole = demo_selection(defs)
    assert _names(per_batch) == {"raw_images", "image_features"}
    assert _names(production) == {"defect_predictions", "review_queue"}  # run once a champion exists
    assert _names(whole) == {
        "trained_model", "challenger_model", "edge_model", "champion_model", "ernie_generated_images", "quality_report",
    }  # fmt: skip
    # A selection without hyperparameter_search is a valid run of the default job: the edge is not an input.
    job = defs.resolve_implicit_global_asset_job_def()
    assert _names(job.get_subset(asset_selection=set(whole)).asset_selection) == _names(whole)


def test_the_landing_sensor_job_selects_exactly_the_ingest_and_scoring_assets():
    selected = ingest_batch_job.selection.resolve(defs.resolve_asset_graph())
    assert _names(selected) == {"raw_images", "image_features", "defect_predictions", "review_queue"}
