"""Great Expectations 1.x on a Spark DataFrame: run one suite, keep GE's own result and data docs.

The suites are small and built in code (see `checks.py`), so the rules live next to the asset they guard;
GE's file context under `.dgx/gx/` keeps every validation result and renders the data docs a person opens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SuiteOutcome:
    success: bool
    statistics: dict
    expectations: list[dict] = field(default_factory=list)  # one entry per expectation, failing examples included
    data_docs: str | None = None


def run_suite(dataframe, suite_name: str, expectations: list, gx_root: Path) -> SuiteOutcome:
    """Validate `dataframe` (Spark) against `expectations` and render the data docs under `gx_root`."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    gx_root.mkdir(parents=True, exist_ok=True)
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(gx_root))
    # GE's tqdm bars would flood the Dagster run log (it captures stderr) with carriage returns.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_or_update_spark(name="dgx_spark")
    asset = _get_or_add(source.get_asset, source.add_dataframe_asset, suite_name)
    batch_definition = _get_or_add(
        asset.get_batch_definition, asset.add_batch_definition_whole_dataframe, f"{suite_name}_whole"
    )
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=suite_name, expectations=expectations))
    validation = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=f"{suite_name}_validation", data=batch_definition, suite=suite)
    )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=f"{suite_name}_checkpoint",
            validation_definitions=[validation],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="update_data_docs")],
            result_format={"result_format": "COMPLETE", "partial_unexpected_count": 10},
        )
    )
    run = checkpoint.run(batch_parameters={"dataframe": dataframe})
    result = next(iter(run.run_results.values()))
    docs = context.get_docs_sites_urls()
    return SuiteOutcome(
        success=bool(result.success),
        statistics=dict(result.statistics),
        expectations=[_describe(r) for r in result.results],
        data_docs=docs[0]["site_url"] if docs else None,
    )


def _get_or_add(get, add, name):
    try:
        return get(name)
    except (KeyError, LookupError, ValueError):
        return add(name)


def _describe(expectation_result) -> dict:
    config = expectation_result.expectation_config
    result = expectation_result.result or {}
    return {
        "expectation": config.type,
        "column": config.kwargs.get("column"),
        "success": bool(expectation_result.success),
        "unexpected_percent": result.get("unexpected_percent"),
        "unexpected_count": result.get("unexpected_count"),
        "observed_value": result.get("observed_value"),
        "failing_examples": [str(v) for v in (result.get("partial_unexpected_list") or [])[:10]],
    }
