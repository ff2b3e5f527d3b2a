"""champion_model: the registry promotion as an asset of its own.

Dagster's blocking checks gate it inside a run (a failed `trained_model` or `edge_model` check skips it). Run on
its own later, it asks the instance the same question and fails closed: every blocking check of both assets
must have passed on their latest materializations. Its materialization is the alias change; the decision and
each gate are tagged on the model version and its training run (edge/promotion.py).
"""

import dagster as dg

from dgx_assets import links
from dgx_assets.edge.assets import EDGE_OWNERS
from dgx_assets.edge.promotion import Gate
from dgx_assets.resources import LakeResource, MlflowResource

GATED_ASSETS = (dg.AssetKey("trained_model"), dg.AssetKey("edge_model"))


def blocking_check_keys(
    context: dg.AssetExecutionContext, asset_key: dg.AssetKey, materialization_run_id: str
) -> list[dg.AssetCheckKey]:
    """The asset's blocking checks: those of the run's asset graph, plus any blocking one evaluated in the run
    that materialized it (a run of champion_model alone may hold fewer checks than the code location)."""
    graph = context.job_def.asset_layer.asset_graph
    keys = {key for key in graph.get_check_keys_for_assets({asset_key}) if graph.get_check_spec(key).blocking}
    records = context.instance.get_records_for_run(
        materialization_run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    for record in records:
        evaluation = record.event_log_entry.asset_check_evaluation
        if evaluation and evaluation.asset_key == asset_key and evaluation.blocking:
            keys.add(evaluation.asset_check_key)
    return sorted(keys, key=lambda key: key.name)


def blocking_checks_gate(context: dg.AssetExecutionContext, asset_key: dg.AssetKey) -> Gate:
    """Did every blocking check of the asset pass on its latest materialization? (fails closed)"""
    name = asset_key.to_user_string()
    latest = context.instance.fetch_materializations(asset_key, limit=1).records
    if not latest:
        return Gate(name, False, f"{name} was never materialized")
    check_keys = blocking_check_keys(context, asset_key, latest[0].run_id)
    if not check_keys:
        return Gate(name, False, f"{name} has no blocking check")
    problems = []
    for key in check_keys:
        record = context.instance.get_latest_asset_check_evaluation_record(key)
        evaluation = record.event.asset_check_evaluation if record and record.event else None
        target = evaluation.target_materialization_data if evaluation else None
        if evaluation is None:
            problems.append(f"{key.name} has not run")
        elif target is None or target.storage_id != latest[0].storage_id:
            problems.append(f"{key.name} did not run on the latest {name}")
        elif not evaluation.passed:
            problems.append(f"{key.name} failed")
    names = ", ".join(key.name for key in check_keys)
    return Gate(name, not problems, "; ".join(problems) or f"{names} passed")


# Makes trained_model's registered version the `champion` once trained_model's and edge_model's blocking checks passed.
@dg.asset(
    deps=["trained_model", "edge_model"],
    group_name="edge",
    kinds={"mlflow"},
    owners=EDGE_OWNERS,
    code_version="1",
    description=(
        "The MLflow registry alias `champion` on the version of trained_model that edge_model was built from. "
        "Runs only when the blocking checks of trained_model and edge_model passed on their latest "
        "materializations; the decision and each gate are tagged on the model version and its training run."
    ),
)
def champion_model(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    from dgx_assets.edge.build import EdgeBuildError, read_parity
    from dgx_assets.edge.promotion import promote_if_gates_pass

    try:
        trained = read_parity(lake.lake)["trained_model"]  # the version edge_model converted and measured
    except EdgeBuildError as error:
        raise dg.Failure(description=str(error)) from error
    gates = [blocking_checks_gate(context, key) for key in GATED_ASSETS]
    try:
        outcome = promote_if_gates_pass(
            mlflow.resolved_tracking_uri,
            trained["registered_model_name"],
            trained["model_version"],
            gates,
            run_id=trained.get("mlflow_run_id"),
            dagster_run_id=context.run_id,
        )
    except ValueError as error:  # the registered version is gone
        raise dg.Failure(description=f"cannot promote: {error}. To fix: re-materialize trained_model and edge_model") from error
    if not outcome.promoted:
        raise dg.Failure(
            description=(
                "not promoted: " + "; ".join(outcome.reasons) + ". To fix: make the failing checks pass "
                "(re-materialize the asset they check), then materialize champion_model"
            ),
            metadata={"model_version": f"{outcome.model_name} v{outcome.version}"},
        )
    context.log.info(f"{outcome.model_name} v{outcome.version} -> {outcome.alias}")
    return dg.MaterializeResult(
        metadata={
            "model_version": f"{outcome.model_name} v{outcome.version}",
            "alias": outcome.alias,
            "previous_champion": str(outcome.previous_champion or "none"),
            "gates": dg.MetadataValue.md("\n".join(f"- {gate.name}: {gate.detail}" for gate in gates)),
            "mlflow_model_version": dg.MetadataValue.url(
                links.mlflow_model_version(mlflow.resolved_ui_url, outcome.model_name, outcome.version)
            ),
        }
    )
