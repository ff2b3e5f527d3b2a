import dagster as dg
from pydantic import Field

from dgx_assets.metadata import number
from dgx_assets.resources import LakeResource, MlflowResource

TRAINED_MODEL = dg.AssetKey("trained_model")


class ParityGateConfig(dg.Config):
    min_agreement: float = Field(0.99, description="Least top-1 agreement of TFLite with trained_model (fraction)")
    max_accuracy_drop_points: float = Field(1.0, description="Most TFLite test accuracy may fall below Keras, in points")


def _blocking_trained_model_checks(context: dg.AssetCheckExecutionContext, materialization_run_id: str):
    """trained_model's blocking checks: from the code location's graph, plus any evaluated in the run that
    materialized it (an in-process run of edge_model alone has no repository to ask)."""
    try:
        graph = context.repository_def.asset_graph
    except Exception:  # no repository set (dg.materialize / execute_in_process): the run's own graph
        graph = context.job_def.asset_layer.asset_graph
    keys = {key for key in graph.get_check_keys_for_assets({TRAINED_MODEL}) if graph.get_check_spec(key).blocking}
    records = context.instance.get_records_for_run(
        materialization_run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    for record in records:
        evaluation = record.event_log_entry.asset_check_evaluation
        if evaluation and evaluation.asset_key == TRAINED_MODEL and evaluation.blocking:
            keys.add(evaluation.asset_check_key)
    return sorted(keys, key=lambda key: key.name)


def trained_model_gate(context: dg.AssetCheckExecutionContext):
    """Did every blocking check of trained_model pass on its latest materialization? (fails closed)."""
    from dgx_assets.edge.promotion import Gate

    latest = context.instance.fetch_materializations(TRAINED_MODEL, limit=1).records
    if not latest:
        return Gate("trained_model", False, "trained_model was never materialized")
    check_keys = _blocking_trained_model_checks(context, latest[0].run_id)
    if not check_keys:
        return Gate("trained_model", False, "trained_model has no blocking check")
    problems = []
    for key in check_keys:
        record = context.instance.get_latest_asset_check_evaluation_record(key)
        evaluation = record.event.asset_check_evaluation if record and record.event else None
        target = evaluation.target_materialization_data if evaluation else None
        if evaluation is None:
            problems.append(f"{key.name} has not run")
        elif target is None or target.storage_id != latest[0].storage_id:
            problems.append(f"{key.name} did not run on the latest trained_model")
        elif not evaluation.passed:
            problems.append(f"{key.name} failed")
    names = ", ".join(key.name for key in check_keys)
    return Gate("trained_model", not problems, "; ".join(problems) or f"{names} passed")


# Blocks downstream and promotion unless the edge model agrees with trained_model on the test split.
@dg.asset_check(
    asset="edge_model",
    name="parity",
    blocking=True,
    description=(
        "TFLite top-1 agreement with trained_model at least min_agreement (99 %) and test accuracy at most "
        "max_accuracy_drop_points (1) below it. When this and trained_model's blocking checks pass, the "
        "registered model version gets the MLflow alias `champion`; the decision is tagged in MLflow either way."
    ),
)
def edge_model_parity(context: dg.AssetCheckExecutionContext, config: ParityGateConfig, lake: LakeResource,
                      mlflow: MlflowResource) -> dg.AssetCheckResult:
    from dgx_assets.edge.build import read_parity
    from dgx_assets.edge.parity import ParityReport, evaluate_gate
    from dgx_assets.edge.promotion import Gate, promote_if_gates_pass

    parity = read_parity(lake.lake)
    report = ParityReport(**parity["report"])
    gate = evaluate_gate(report, config.min_agreement, config.max_accuracy_drop_points / 100.0)
    gates = [trained_model_gate(context), Gate("edge_parity", gate.passed, "; ".join(gate.reasons) or "passed")]
    trained = parity["trained_model"]
    try:
        outcome = promote_if_gates_pass(
            mlflow.resolved_tracking_uri, trained["registered_model_name"], trained["model_version"], gates,
            run_id=trained.get("mlflow_run_id"), dagster_run_id=context.run.run_id,
        )
        promoted = outcome.promoted
        promotion = (f"{outcome.model_name} v{outcome.version} -> {outcome.alias}" if promoted
                     else "blocked: " + "; ".join(outcome.reasons))
        previous = str(outcome.previous_champion)
    except ValueError as error:  # the registered version is gone: parity still stands, promotion cannot happen
        promoted, promotion, previous = False, f"impossible: {error}", "unknown"
    context.log.info(f"Promotion of trained_model's version: {promotion}")
    return dg.AssetCheckResult(
        passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=("; ".join(gate.reasons) + ". To fix: set `quantization: float16` in edge_model's config or train "
                     "trained_model longer, then re-materialize edge_model") if not gate.passed
        else "edge model agrees with trained_model",
        metadata={
            "top1_agreement": number(report.top1_agreement),
            "min_agreement": config.min_agreement,
            "tflite_test_accuracy": number(report.tflite_accuracy),
            "keras_test_accuracy": number(report.keras_accuracy),
            "accuracy_drop_points": number((report.keras_accuracy - report.tflite_accuracy) * 100, 2),
            "max_accuracy_drop_points": config.max_accuracy_drop_points,
            "test_images": report.images,
            "trained_model_gate": gates[0].detail,
            "promoted": promoted,
            "promotion": promotion,
            "previous_champion": previous,
        },
    )
