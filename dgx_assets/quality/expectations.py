"""Great Expectations 1.x on a Spark DataFrame: run one suite, keep GE's own result and data docs.

The suites are small and built in code (see `checks.py`), so the rules live next to the asset they guard;
GE's file context under `.dgx/gx/` keeps every validation result and renders the data docs a person opens.
GE's pages load Bootstrap and jQuery from CDNs, which an air-gapped cluster cannot reach: after each build the
pages are pointed at copies shipped by the XStatic packages, and bootstrap-table (no Python package ships it)
is replaced by a small script that draws the same tables.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dgx_assets import settings


@dataclass
class SuiteOutcome:
    success: bool
    statistics: dict
    expectations: list[dict] = field(default_factory=list)  # one entry per expectation, failing examples included
    data_docs: str | None = None


def run_suite(dataframe, suite_name: str, expectations: list, gx_root: Path, run_name: str | None = None) -> SuiteOutcome:
    """Validate `dataframe` (Spark) against `expectations` and render the data docs under `gx_root`.

    `run_name` names the validation in the data docs (asset, check and batch), so the results of several
    batches can be told apart there; without it GE shows `__none__`.
    """
    settings.apply_process_defaults()  # GE reports analytics unless told not to
    import great_expectations as gx

    gx_root.mkdir(parents=True, exist_ok=True)
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(gx_root))
    # GE's tqdm bars would flood the Dagster run log (it captures stderr) with carriage returns.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_or_update_spark(name="dgx_spark")
    asset = _get_or_add(source.get_asset, source.add_dataframe_asset, suite_name)
    batch_definition = _get_or_add(asset.get_batch_definition, asset.add_batch_definition_whole_dataframe, f"{suite_name}_whole")
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=suite_name, expectations=expectations))
    validation = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=f"{suite_name}_validation", data=batch_definition, suite=suite)
    )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=f"{suite_name}_checkpoint",
            validation_definitions=[validation],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="update_data_docs")],  # pyright: ignore[reportPrivateImportUsage]
            result_format={"result_format": "COMPLETE", "partial_unexpected_count": 10},
        )
    )
    from great_expectations.core.run_identifier import RunIdentifier

    run = checkpoint.run(batch_parameters={"dataframe": dataframe}, run_id=RunIdentifier(run_name=run_name or suite_name))
    result = next(iter(run.run_results.values()))
    docs = context.get_docs_sites_urls()
    site_url = docs[0]["site_url"] if docs else None  # None too when GE finds no built index page
    if site_url:
        offline_data_docs(_site_dir(site_url))
    return SuiteOutcome(
        success=bool(result.success),
        statistics=dict(result.statistics),
        expectations=[_describe(r) for r in result.results],
        data_docs=docs_address(site_url) if site_url else None,
    )


def data_docs_site(gx_root: Path | None = None) -> Path:
    """GE's data docs site of the context under `gx_root` (default `<state>/gx`): what the docs server serves."""
    return (gx_root or settings.environment().state_dir / "gx") / "gx" / "uncommitted" / "data_docs" / "local_site"


def docs_address(site_url: str) -> str:
    """A data docs page's http address on the docs server (DGX_DOCS_URL), which serves the state folder's site;
    GE's own file URL for a site elsewhere."""
    from urllib.parse import unquote, urlparse

    from dgx_assets import links

    page, site = Path(unquote(urlparse(site_url).path)).resolve(), data_docs_site().resolve()
    if not page.is_relative_to(site):
        return site_url
    return links.docs_page(settings.environment().docs_url, links.DATA_DOCS_ROUTE, *page.relative_to(site).parts)


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


def _site_dir(site_url: str) -> Path:
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(site_url).path)).parent


# CDN file name -> the local copy that replaces it (None: dropped, the pages read well without it).
_VENDORED = {
    "bootstrap.min.css": ("xstatic.pkg.bootstrap", "css/bootstrap.min.css"),
    "bootstrap.min.js": ("xstatic.pkg.bootstrap", "js/bootstrap.bundle.min.js"),  # the bundle carries popper
    "jquery-3.7.1.min.js": ("xstatic.pkg.jquery", "jquery.min.js"),
    "bootstrap-table.min.js": (None, "bootstrap-table-offline.js"),
}
_CDN_TAG = re.compile(r'<link[^>]*href="(https?://[^"]+)"[^>]*>|<script[^>]*src="(https?://[^"]+)"[^>]*>\s*</script>')
_REMOTE_IMAGE = re.compile(r'src="https?://[^"]*great-expectations-web-assets[^"]*"')

# Draws GE's tables (the index's list of validations, each with a link to its page) without bootstrap-table.
_TABLE_SCRIPT = """// dgx_assets: a stand-in for bootstrap-table, which GE loads from a CDN an offline cluster cannot reach.
(function ($) {
  // Font Awesome (also a CDN) drew the status icons: plain characters instead.
  $("head").append("<style>.fas.fa-check-circle::before{content:'\\\\2714';}.fas.fa-times::before,"
    + ".fas.fa-times-circle::before{content:'\\\\2716';}.fas.fa-exclamation-triangle::before{content:'\\\\26A0';}"
    + ".fas{font-style:normal;}</style>");
  function cell(value) { return value === undefined || value === null ? "" : String(value); }
  $.fn.bootstrapTable = function (options) {
    if (typeof options !== "object") { return this; }  // method calls ('resetSearch' ...) have nothing to do
    var columns = (options.columns || []).filter(function (c) { return c.visible !== false; });
    var linked = columns.some(function (c) { return c.field === "run_name"; }) ? "run_name" : (columns[0] || {}).field;
    var head = columns.map(function (c) { return "<th>" + cell(c.title || c.field) + "</th>"; }).join("");
    var body = (options.data || []).map(function (row) {
      var cells = columns.map(function (c) {
        var text = cell(row[c.field]);
        var link = c.field === linked ? row._table_row_link_path : null;
        return "<td>" + (link ? "<a href='" + link + "'>" + text + "</a>" : text) + "</td>";
      });
      return "<tr>" + cells.join("") + "</tr>";
    }).join("");
    return this.addClass("table table-sm table-striped table-hover")
      .html("<thead><tr>" + head + "</tr></thead><tbody>" + body + "</tbody>");
  };
})(jQuery);
"""


def _local_tag(match: re.Match, prefix: str) -> str:
    address = match.group(1) or match.group(2)
    vendored = _VENDORED.get(address.rsplit("/", 1)[-1])
    if vendored is None:
        return ""
    file = f"{prefix}/{Path(vendored[1]).name}"
    return f'<link rel="stylesheet" href="{file}">' if match.group(1) else f'<script src="{file}"></script>'


def offline_data_docs(site: Path) -> int:
    """Point every data docs page under `site` at local copies of its scripts and styles; returns pages changed.

    Idempotent: a page already rewritten has no CDN address left, so a rebuild only touches the new pages.
    """
    import importlib

    vendor = site / "static" / "vendor"
    vendor.mkdir(parents=True, exist_ok=True)
    for module, name in _VENDORED.values():
        target = vendor / Path(name).name
        if module is None:
            target.write_text(_TABLE_SCRIPT)
        elif not target.exists():
            shutil.copyfile(Path(importlib.import_module(module).BASE_DIR) / name, target)
    changed = 0
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        prefix = os.path.relpath(vendor, page.parent)
        rewritten = _CDN_TAG.sub(lambda match, prefix=prefix: _local_tag(match, prefix), text)
        # GE's logo comes from its web bucket (with the context's id in the query): its own static copy serves.
        logo = os.path.relpath(site / "static" / "images" / "logo-long.png", page.parent)
        rewritten = _REMOTE_IMAGE.sub(f'src="{logo}"', rewritten)
        # A Spark DataFrame batch has no asset name in its spec, so GE prints "None"; the page's own file name is
        # the batch id (<data source>-<asset>).
        rewritten = rewritten.replace("Data asset: None<br>", f"Data asset: {page.stem}<br>")
        if rewritten != text:
            page.write_text(rewritten, encoding="utf-8")
            changed += 1
    return changed
