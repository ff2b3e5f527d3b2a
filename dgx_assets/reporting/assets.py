import tempfile
from pathlib import Path

import dagster as dg

from dgx_assets.edge.checks import edge_model_parity
from dgx_assets.generation.checks import generation_checks
from dgx_assets.ingest.checks import raw_image_checks
from dgx_assets.resources import LakeResource, MlflowResource
from dgx_assets.training.checks import beats_baseline_and_champion

# The checks the report sums up, declared by their domains (the code location's definitions import this module).
REPORTED_CHECKS = [*raw_image_checks, beats_baseline_and_champion, edge_model_parity, *generation_checks]

UPSTREAM = ["raw_images", "image_features", "trained_model", "edge_model", "ernie_generated_images", "challenger_model"]


# Sums up every other asset and its checks into one page: fit to use, or what to fix.
@dg.asset(
    deps=UPSTREAM,
    group_name="reporting",
    kinds={"html", "mlflow"},
    owners=["team:data-platform"],
    code_version="1",
    description=(
        "One self-contained HTML page, `<lake>/quality_report/report.html`: ingestion per batch, Great Expectations "
        "results, image statistics with drift and label-balance shift, model metrics against baseline and yardsticks, "
        "the edge model's parity, generated images with their prompts, the hardware baseline, links to MLflow, "
        "Dagster and the data docs, and a pass/warn/fail verdict from the checks."
    ),
)
def quality_report(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource):
    from dgx_assets import links as urls
    from dgx_assets import settings
    from dgx_assets.challenger import report as challenger_report
    from dgx_assets.reporting import collect, render  # pyarrow, scipy, matplotlib: only when a report is made
    from dgx_assets.reporting.verdict import decide

    store = lake.lake
    # The report's own verdict check follows from the report: counting it would feed the last verdict into the next.
    check_keys = sorted(
        (key for key in _check_keys(context) if key.asset_key != context.asset_key),
        key=lambda k: (k.asset_key.to_user_string(), k.name),
    )
    data = collect.ReportData(
        batches=collect.ingestion(store),
        checks=collect.check_outcomes(context.instance, check_keys),
        ge_data_docs=collect.data_docs_url(context.instance, check_keys),
        model=collect.model_info(store),
        edge=collect.latest_metadata(context.instance, dg.AssetKey("edge_model")),
        generated=collect.generated_images(store),
    )
    data.statistics, data.ks = collect.image_statistics(store)
    data.drift = [row for row in data.ks if row["flagged"]]
    data.label_balance = collect.label_balance(data.batches)
    data.comparison = challenger_report.compare(store, data.model, data.edge)
    run_id = (data.model or {}).get("mlflow_run_id")
    if run_id:
        data.curves, data.hardware = collect.mlflow_details(mlflow.resolved_tracking_uri, run_id)
    present = {
        "raw_images": data.batches,
        "image_features": data.statistics,
        "trained_model": data.model,
        "edge_model": data.edge,
        "ernie_generated_images": data.generated,
    }
    data.missing = [name for name, value in present.items() if not value]
    shifts = [
        f"batch {row['batch']} has {row['share']:.0%} {row['class']} against {row['others_share']:.0%} in the "
        f"other batches (p {row['p_value']:.1g})"
        for row in data.label_balance
        if row["flagged"]
    ]
    verdict = decide(
        data.checks, [f"{d['statistic']} of batch {d['batch']} (KS {d['ks']})" for d in data.drift], data.missing, shifts
    )

    # Only addresses a browser opens: MLflow's and Dagster's UIs (DGX_MLFLOW_UI_URL, DGX_DAGSTER_UI_URL), files.
    dagster_ui = settings.dagster_ui_url()
    links = {
        "this report's Dagster run": urls.dagster_run(dagster_ui, context.run_id),
        "quality_report in Dagster": urls.dagster_asset(dagster_ui, "quality_report"),
    }
    if data.model:
        model = data.model
        if model.get("mlflow_experiment_id") and run_id:
            links["MLflow run of trained_model"] = urls.mlflow_run(mlflow.resolved_ui_url, model["mlflow_experiment_id"], run_id)
        if model.get("registered_model_name") and model.get("model_version"):
            links["MLflow model version"] = urls.mlflow_model_version(
                mlflow.resolved_ui_url, model["registered_model_name"], str(model["model_version"])
            )
        links["trained_model in Dagster"] = urls.dagster_asset(dagster_ui, "trained_model")
    if data.ge_data_docs:
        links["Great Expectations data docs"] = data.ge_data_docs
    page = render.render_html(data, verdict, links)
    report_uri = store.uri("quality_report", "report.html")
    store.write_bytes(report_uri, page.encode())
    if run_id:
        _log_to_mlflow(mlflow.resolved_tracking_uri, run_id, page)
    context.log.info(f"quality report: {verdict.level} -> {report_uri}")
    return dg.MaterializeResult(
        metadata={
            "verdict": verdict.level,
            "reasons": dg.MetadataValue.json(verdict.reasons),
            "summary": dg.MetadataValue.md(render.render_markdown(data, verdict, report_uri)),
            "path": dg.MetadataValue.path(report_uri),
            "checks_evaluated": len(data.checks),
            **(
                {"mlflow_model_version": dg.MetadataValue.url(links["MLflow model version"])}
                if "MLflow model version" in links
                else {}
            ),
        }
    )


def _check_keys(context: dg.AssetExecutionContext) -> set[dg.AssetCheckKey]:
    """The domains' checks, plus any other check of the run's asset graph (a stand-in's in a test)."""
    declared = {key for checks in REPORTED_CHECKS for key in checks.check_keys}
    return declared | set(context.job_def.asset_layer.asset_graph.asset_check_keys)


def _log_to_mlflow(tracking_uri: str, run_id: str, page: str) -> None:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "quality_report.html"
        path.write_text(page)
        MlflowClient(tracking_uri=tracking_uri).log_artifact(run_id, str(path), "quality_report")


# Turns the report's verdict into a check result, so a schedule, sensor or person can act on it.
@dg.asset_check(asset=quality_report, description="The quality report's verdict: fails on `fail`, warns on `warn`.")
def report_verdict(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    event = context.instance.get_latest_materialization_event(quality_report.key)
    metadata = event.asset_materialization.metadata if event else {}
    level = metadata["verdict"].value if "verdict" in metadata else "fail"
    reasons = metadata["reasons"].value if "reasons" in metadata else ["quality_report has not been materialized"]
    return dg.AssetCheckResult(
        passed=level == "pass",
        severity=dg.AssetCheckSeverity.ERROR if level == "fail" else dg.AssetCheckSeverity.WARN,
        metadata={"verdict": level, "reasons": dg.MetadataValue.json(reasons)},
    )
