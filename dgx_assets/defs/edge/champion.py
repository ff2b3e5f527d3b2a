"""champion_model: the registry promotion as an asset of its own, and the record of every decision.

It always runs after trained_model and edge_model and asks the instance whether the promotion checks passed on
their latest materializations (fails closed). All passed: the version becomes `champion`. Otherwise it is held
back: the champion stays, the version keeps `candidate`, and the materialization says so with the reason and the
fix, as do the tags on the model version (edge/promotion.py). Held back is a decision, not an error: the run goes
on, so the quality report of the same run explains it.
"""

import dagster as dg

from dgx_assets import links
from dgx_assets.defs.edge.assets import EDGE_OWNERS, edge_model
from dgx_assets.defs.model.checks import MODEL_GATE_CHECK
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.edge.promotion import HELD_BACK, PromotionOutcome
from dgx_assets.gates import Criterion, Gate
from dgx_assets.metadata import fix_of, table, thresholds, to_fix

# The checks a version must pass to become champion, known from their definitions: trained_model's gate and
# edge_model's parity, each judged in its asset's own step, so both are in before champion_model runs.
PROMOTION_CHECKS = tuple(sorted({MODEL_GATE_CHECK.key, *edge_model.check_keys}, key=str))
FIX_THEN = "Then materialize champion_model again (or Materialize all)."


def check_gate(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> Gate:
    """Did the check pass on its asset's latest materialization? Anything else holds the promotion back."""
    asset = key.asset_key.to_user_string()
    name = f"{asset}.{key.name}"
    latest = instance.fetch_materializations(key.asset_key, limit=1).records
    if not latest:
        return Gate(name, False, f"{asset} was never materialized", to_fix=f"Materialize {asset}")
    record = instance.get_latest_asset_check_evaluation_record(key)
    evaluation = record.event.asset_check_evaluation if record and record.event else None
    target = evaluation.target_materialization_data if evaluation else None
    if evaluation is None:
        return Gate(name, False, f"{key.name} has not run on {asset}", to_fix=f"Execute the check {key.name}")
    if target is None or target.storage_id != latest[0].storage_id:
        return Gate(name, False, f"{key.name} did not run on the latest {asset}", to_fix=f"Execute the check {key.name}")
    # Each figure the check compared with a threshold (metadata `name` beside `max_name` or `min_name`).
    criteria = tuple(Criterion.judge(*found) for found in thresholds(evaluation.metadata or {}))
    detail = evaluation.description or ("passed" if evaluation.passed else "failed")
    return Gate(name, bool(evaluation.passed), detail, criteria, to_fix=fix_of(evaluation.metadata or {}))


def decision_metadata(outcome: PromotionOutcome, gates: list[Gate], version_url: str) -> dict:
    """What champion_model's page shows: the decision first, then why, what to fix and each gate's figures."""
    champion = f"v{outcome.champion}" if outcome.champion else "none"
    if outcome.promoted:
        before = f"v{outcome.previous_champion}" if outcome.previous_champion else "none"
        summary = f"{outcome.model_name} v{outcome.version} is the {outcome.alias} (before: {before})"
    else:
        summary = f"{outcome.status}; the {outcome.alias} stays {champion}"
    failed = [gate for gate in gates if not gate.passed]
    rows = [
        [gate.name, criterion.name, criterion.value, criterion.threshold_text, "passed" if criterion.passed else "**failed**"]
        for gate in gates
        for criterion in gate.criteria
    ]
    return {
        "decision": "promoted" if outcome.promoted else HELD_BACK,
        "outcome": summary,
        **(
            {
                "reason": dg.MetadataValue.md("\n\n".join(f"**{gate.name}** failed: {gate.detail}" for gate in failed)),
                **to_fix(" ".join([*(f"{gate.to_fix.rstrip('.')}." for gate in failed if gate.to_fix), FIX_THEN])),
            }
            if failed
            else {}
        ),
        "model_version": f"{outcome.model_name} v{outcome.version}",
        "champion": champion,
        "gates": dg.MetadataValue.md("\n".join(f"- {gate.name}: {'passed' if gate.passed else 'failed'}" for gate in gates)),
        **({"gate_criteria": table(["gate", "criterion", "figure", "threshold", "result"], rows)} if rows else {}),
        "mlflow_model_version": dg.MetadataValue.url(version_url),
    }


def held_back_summary(metadata: dict) -> str | None:
    """One line for a held-back decision (champion_model's metadata values): who, that it stays candidate, why and
    what to fix, in Markdown. None for a promotion."""
    if metadata.get("decision") != HELD_BACK:
        return None
    sentences = [
        str(metadata.get("outcome", "")),
        *str(metadata.get("reason", "")).split("\n\n"),
        fix_of(metadata),
    ]
    return " ".join(f"{sentence.rstrip('.')}." for sentence in sentences if sentence.strip())


# Makes trained_model's version `champion` when every promotion check passed; otherwise records why it is held back.
@dg.asset(
    deps=["trained_model", "edge_model"],
    group_name="edge",
    kinds={"mlflow"},
    owners=EDGE_OWNERS,
    code_version="2",  # up when the same checks would be decided or recorded otherwise: docs/decisions/0004
    description=(
        "The decision on the version of trained_model that edge_model was built from: promoted to the MLflow alias "
        "`champion` when trained_model's and edge_model's promotion checks passed on their latest materializations, "
        "else **held back** (it stays `candidate`, the champion stays): the materialization's `decision`, `reason` "
        "and `to_fix` say why, and the same is tagged on the model version and its training run."
    ),
)
def champion_model(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    from dgx_assets.edge.build import EdgeBuildError, read_parity
    from dgx_assets.edge.promotion import promote_if_gates_pass

    try:
        trained = read_parity(lake.lake)["trained_model"]  # the version edge_model converted and measured
    except EdgeBuildError as error:
        raise dg.Failure(description=str(error)) from error
    gates = [check_gate(context.instance, key) for key in PROMOTION_CHECKS]
    try:
        outcome = promote_if_gates_pass(
            mlflow.tracking_config().tracking_uri,
            trained["registered_model_name"],
            trained["model_version"],
            gates,
            run_id=trained.get("mlflow_run_id"),
            dagster_run_id=context.run_id,
        )
    except ValueError as error:  # the registered version is gone
        raise dg.Failure(
            description=f"cannot promote: {error}", metadata=to_fix("Re-materialize trained_model and edge_model")
        ) from error
    version_url = links.mlflow_model_version(mlflow.tracking_config().ui_url, outcome.model_name, outcome.version)
    metadata = decision_metadata(outcome, gates, version_url)
    (context.log.info if outcome.promoted else context.log.warning)(f"{metadata['decision']}: {metadata['outcome']}")
    # The data version is the champion itself: a held-back decision leaves it, and what reads it, unchanged.
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(f"champion {outcome.champion or 'none'}"))
