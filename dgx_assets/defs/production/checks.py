"""embedding_drift: is a scored batch drawn like the images its champion was trained on?

The one drift verdict of the platform: the quality report and its Verdict line read it (the image statistics'
KS tests stay in the report as supporting figures). The statistics are in dgx_assets/production/drift.py.
"""

import dagster as dg

from dgx_assets import metadata
from dgx_assets.defs.production.predictions import defect_predictions
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.partitions import check_each_batch, image_batches
from dgx_assets.production.drift import DRIFT_CHECK

REEMBED = "Re-materialize image_features with embedding efficientnet_lite0 (its default), then defect_predictions"


# Warns when a batch's pretrained embeddings are unlike those of the champion's training images; scores still land.
@dg.asset_check(
    asset=defect_predictions,
    name=DRIFT_CHECK,
    partitions_def=image_batches,
    description=(
        "Embedding drift of the batch against the training split the scoring version was trained on: Evidently's "
        "domain-classifier method (out-of-sample ROC AUC, bar 0.55) with a permutation p-value (alpha 0.01), so a "
        "60-image batch drawn like the training data does not raise it. Beside it: the predicted defect rate against "
        "the training prevalence (exact binomial test)."
    ),
)
def embedding_drift(context: dg.AssetCheckExecutionContext, lake: LakeResource, mlflow: MlflowResource) -> dg.AssetCheckResult:
    tracking_uri = mlflow.tracking_config().tracking_uri
    return check_each_batch(context, lambda batch: _judge_batch(lake, tracking_uri, batch))


def _judge_batch(lake: LakeResource, tracking_uri: str, batch: str) -> dg.AssetCheckResult:
    from dgx_assets.production.drift import MIN_ROWS, judge_embedding_drift, prediction_drift
    from dgx_assets.production.reference import batch_embeddings, scored_version, training_embeddings
    from dgx_assets.production.scoring import registered_version

    store = lake.lake
    model_name, version, predicted = scored_version(store, batch)
    champion = registered_version(tracking_uri, model_name, version)
    reference = training_embeddings(store, champion)
    current = batch_embeddings(store, batch)
    warn = dg.AssetCheckSeverity.WARN
    if reference.embeddings is None or current is None:
        return dg.AssetCheckResult(
            passed=False,
            severity=warn,
            description="no embeddings to compare: image_features was built with embedding none",
            metadata=metadata.to_fix(REEMBED),
        )
    if min(len(current), len(reference.embeddings)) < MIN_ROWS:
        return dg.AssetCheckResult(
            passed=True,
            severity=warn,
            description=f"{len(current)} images against {len(reference.embeddings)} training images: too few to judge "
            f"drift (at least {MIN_ROWS} each)",
        )
    drift = judge_embedding_drift(reference.embeddings, current)
    positive = champion.positive_class
    prevalence = reference.prevalence(positive)
    # Recorded beside the verdict, not part of it: a line can make more defects without its images changing.
    outcome = (
        prediction_drift(sum(1 for label in predicted if label == positive), len(predicted), prevalence)
        if 0 < prevalence < 1
        else None
    )
    return dg.AssetCheckResult(
        passed=not drift.drifted,
        severity=warn,
        description="; ".join([drift.summary(), *([outcome.summary()] if outcome else [])]),
        metadata={
            **metadata.gated("roc_auc", drift.roc_auc, drift.auc_threshold),
            "p_value": metadata.number(drift.p_value, 6),
            "alpha": drift.alpha,
            "method": drift.method,
            "reference": f"image_features snapshot {reference.snapshot_id}, split train, {drift.reference_rows} rows",
            "drift": dg.MetadataValue.json(drift.to_dict()),
            **({"prediction_drift": dg.MetadataValue.json(outcome.to_dict())} if outcome else {}),
            "model_version": f"{model_name} v{version}",
            **(
                metadata.to_fix(
                    "Look at the batch's images beside the training data (the report's production section): a new "
                    "camera, cell type or a dirty lens? Label its review queue (dgx-assets import-labels) and retrain."
                )
                if drift.drifted
                else {}
            ),
        },
    )
