import tempfile
from pathlib import Path

import dagster as dg

from dgx_assets.defs.edge.assets import edge_model
from dgx_assets.defs.edge.champion import PROMOTION_CHECKS, held_back_summary
from dgx_assets.defs.generation.checks import generation_checks
from dgx_assets.defs.ingest.checks import raw_image_checks
from dgx_assets.defs.model.training import trained_model
from dgx_assets.defs.production.checks import embedding_drift
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.links import REPORT_PAGE, REPORT_ROUTE

# The checks the report sums up, known from their domains' definitions (trained_model and edge_model run theirs
# in their own steps).
REPORTED_CHECKS = sorted(
    {
        key
        for checked in (*raw_image_checks, trained_model, edge_model, *generation_checks, embedding_drift)
        for key in checked.check_keys
    },
    key=lambda key: (key.asset_key.to_user_string(), key.name),
)

# champion_model last among them: the report explains its decision, promoted or held back, in the same run.
UPSTREAM = [
    "raw_images",
    "image_features",
    "trained_model",
    "edge_model",
    "champion_model",
    "ernie_generated_images",
    "challenger_model",
    "defect_predictions",
]


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
    from dgx_assets.reporting import render  # pyarrow, scipy, matplotlib, jinja2: only when a report is made

    store = lake.lake
    data = _gather(context.instance, store, mlflow.tracking_config().tracking_uri)
    verdict = _verdict(data)
    links = _links(context.run_id, data, mlflow.tracking_config().ui_url)
    page = render.render_html(data, verdict, links)
    report_uri = store.uri(REPORT_ROUTE, REPORT_PAGE)
    store.write_bytes(report_uri, page.encode())
    run_id = (data.model or {}).get("mlflow_run_id")
    if run_id:
        _log_to_mlflow(mlflow.tracking_config().tracking_uri, run_id, page)
    context.log.info(f"quality report: {verdict.level} -> {report_uri}")
    return dg.MaterializeResult(
        metadata={
            # Opens over http (the docs server `make dev` starts): browsers refuse file:// links from the UI.
            "report": dg.MetadataValue.url(links[REPORT]),
            "verdict": verdict.level,
            "reasons": dg.MetadataValue.md("\n".join(f"- {reason}" for reason in verdict.reasons)),
            "summary": dg.MetadataValue.md(render.render_markdown(data, verdict, report_uri)),
            "path": dg.MetadataValue.path(report_uri),
            "checks_evaluated": len(data.checks),
            **({"mlflow_model_version": dg.MetadataValue.url(links[MODEL_VERSION])} if MODEL_VERSION in links else {}),
        }
    )


MODEL_VERSION, REPORT = "MLflow model version", "this report"


def _gather(instance: dg.DagsterInstance, store, tracking_uri: str):
    """Everything the report shows, read from the lake, the instance and MLflow."""
    from dgx_assets.challenger import report as challenger_report
    from dgx_assets.reporting import collect
    from dgx_assets.reporting.production import production as collect_production

    data = collect.ReportData(
        batches=collect.ingestion(store),
        # Not the report's own verdict check: it follows from the report, counting it would feed one verdict into the next.
        checks=collect.check_outcomes(instance, REPORTED_CHECKS),
        ge_data_docs=collect.data_docs_url(instance, REPORTED_CHECKS),
        model=collect.model_info(store),
        edge=collect.latest_metadata(instance, dg.AssetKey("edge_model")),
        edge_ladder=collect.edge_ladder(store),
        generated=collect.generated_images(store),
        promotion=collect.promotion(instance),
    )
    data.statistics, data.ks = collect.image_statistics(store)
    data.drift = [row for row in data.ks if row["flagged"]]
    data.production = collect_production(store, data.checks)
    data.label_balance = collect.label_balance(data.batches)
    data.comparison = challenger_report.compare(store, data.model, data.edge)
    run_id = (data.model or {}).get("mlflow_run_id")
    if run_id:
        data.curves, data.hardware = collect.mlflow_details(tracking_uri, run_id)
    present = {
        "raw_images": data.batches,
        "image_features": data.statistics,
        "trained_model": data.model,
        "edge_model": data.edge,
        "ernie_generated_images": data.generated,
    }
    data.missing = [name for name, value in present.items() if not value]
    return data


def _verdict(data):
    from dgx_assets.reporting.verdict import decide

    shifts = [
        f"batch {row['batch']} has {row['share']:.0%} {row['class']} against {row['others_share']:.0%} in the "
        f"other batches (p {row['p_value']:.1g})"
        for row in data.label_balance
        if row["flagged"]
    ]
    # The drift verdict is embedding_drift's, a warning check among data.checks; the KS tests are supporting figures.
    return decide(
        data.checks,
        data.missing,
        shifts,
        held_back=held_back_summary(data.promotion or {}),
        gate_checks={(key.asset_key.to_user_string(), key.name) for key in PROMOTION_CHECKS},
    )


def _links(report_run_id: str, data, mlflow_ui: str) -> dict[str, str]:
    """Only addresses a browser opens: MLflow's and Dagster's UIs (DGX_MLFLOW_UI_URL, DGX_DAGSTER_UI_URL) and the
    docs server (DGX_DOCS_URL: this report, GE's data docs)."""
    from dgx_assets import links as urls
    from dgx_assets import settings
    from dgx_assets.reporting.render import DECISION_RUN

    dagster_ui = settings.environment().dagster_ui_url
    links = {REPORT: urls.docs_page(settings.environment().docs_url, REPORT_ROUTE, REPORT_PAGE)}
    if data.promotion:  # the run that decided, which is what a reader of the verdict wants to open
        links[DECISION_RUN] = urls.dagster_run(dagster_ui, data.promotion["run_id"])
    links["the Dagster run that made this report"] = urls.dagster_run(dagster_ui, report_run_id)
    links["quality_report in Dagster"] = urls.dagster_asset(dagster_ui, "quality_report")
    model = data.model or {}
    run_id = model.get("mlflow_run_id")
    if model.get("mlflow_experiment_id"):
        links["MLflow training runs"] = urls.mlflow_runs(mlflow_ui, model["mlflow_experiment_id"])
    if model.get("mlflow_experiment_id") and run_id:
        links["MLflow run of trained_model"] = urls.mlflow_run(mlflow_ui, model["mlflow_experiment_id"], run_id)
    if model.get("registered_model_name") and model.get("model_version"):
        links[MODEL_VERSION] = urls.mlflow_model_version(mlflow_ui, model["registered_model_name"], str(model["model_version"]))
    if model:
        links["trained_model in Dagster"] = urls.dagster_asset(dagster_ui, "trained_model")
    if data.ge_data_docs:
        links["Great Expectations data docs"] = data.ge_data_docs
    return links


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
    materialization = event.asset_materialization if event else None
    metadata = materialization.metadata if materialization else {}
    level = str(metadata["verdict"].value) if "verdict" in metadata else "fail"
    reasons = str(metadata["reasons"].value) if "reasons" in metadata else "- quality_report has not been materialized"
    return dg.AssetCheckResult(
        passed=level == "pass",
        severity=dg.AssetCheckSeverity.ERROR if level == "fail" else dg.AssetCheckSeverity.WARN,
        # The result as people read it in the check's list: the verdict, then why, one reason a line.
        description=f"Verdict: {level}.\n\n{reasons}",
        metadata={"verdict": level, "reasons": dg.MetadataValue.md(reasons)},
    )
