"""The retraining sensor against a real Dagster instance: what it sees is what the assets and checks recorded."""

import time

import dagster as dg

from dgx_assets.defs.production.sensors import retrain_on_new_labels
from dgx_assets.production.drift import DRIFT_CHECK

LABELS = "line4-labels-20261206T120000Z"  # a batch import-labels wrote


def materialize(instance, asset, partition=None, **metadata):
    instance.report_runless_asset_event(dg.AssetMaterialization(asset, partition=partition, metadata=metadata))
    time.sleep(0.01)  # records after it are later than it


def drift(instance, batch, passed):
    evaluation = dg.AssetCheckEvaluation(dg.AssetKey("defect_predictions"), DRIFT_CHECK, passed, partition=batch)
    instance.report_runless_asset_event(evaluation)


def evaluate(instance, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    return retrain_on_new_labels(context), context.cursor


def test_imported_labels_request_one_retraining_then_the_interval_holds_the_next(monkeypatch):
    monkeypatch.setenv("DGX_RETRAIN_MIN_INTERVAL_S", "3600")
    with dg.instance_for_test() as instance:
        materialize(instance, "raw_images", LABELS, labelled_images=12)  # before the last training: in the model
        materialize(instance, "trained_model")
        result, cursor = evaluate(instance)
        assert isinstance(result, dg.SkipReason) and "no imported labels" in result.skip_message
        materialize(instance, "raw_images", LABELS, labelled_images=12)
        request, cursor = evaluate(instance, cursor)
        assert isinstance(request, dg.RunRequest) and request.tags["dgx/trigger"] == "new-labels"
        assert LABELS in request.tags["dgx/reason"]
        again, _ = evaluate(instance, cursor)
        assert isinstance(again, dg.SkipReason) and "DGX_RETRAIN_MIN_INTERVAL_S" in again.skip_message


def test_drift_retrains_only_once_new_labelled_images_exist(monkeypatch):
    monkeypatch.setenv("DGX_RETRAIN_MIN_INTERVAL_S", "0")
    with dg.instance_for_test() as instance:
        materialize(instance, "trained_model")
        drift(instance, "line-2", passed=False)
        materialize(instance, "raw_images", "line-2", labelled_images=0, production_images=60)
        result, _ = evaluate(instance)
        assert isinstance(result, dg.SkipReason) and "drift on line-2, but no new labelled images" in result.skip_message
        materialize(instance, "raw_images", "lot-7", labelled_images=40)
        request, _ = evaluate(instance)
        assert isinstance(request, dg.RunRequest) and request.tags["dgx/trigger"] == "drift"
        materialize(instance, "trained_model")  # the retraining ran: the drift and the labels are behind it
        result, _ = evaluate(instance)
        assert isinstance(result, dg.SkipReason) and result.skip_message == "no imported labels since trained_model last ran"


def test_the_sensor_knows_the_batches_import_labels_names():
    import datetime as dt

    from dgx_assets.labels.importer import batch_name, is_label_batch

    assert is_label_batch(batch_name("line4", dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC))) and is_label_batch(LABELS)
    assert not is_label_batch("line4") and not is_label_batch("line4-labels-yesterday")
