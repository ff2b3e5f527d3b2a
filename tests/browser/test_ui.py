"""`make e2e`: Debian's chromium, driven by Playwright, walks what a user opens after a "Materialize all" whose
parity gate holds the model back: the asset graph (every asset visible), an asset page with its MLflow links,
champion_model's page reading "held back" with the reason, the quality report opened over http from Dagster's
metadata (its Chinese prompts drawn with CJK glyphs, its production section's saliency pictures), every MLflow
link in the model-training view, and GE's data docs over http, all offline. Screenshots of each are kept under
`.dgx/screenshots/` (CI keeps them as artifacts).

Builds what it needs quickly and for real: two small landing batches, raw_images with its GE checks and
image_features per batch, then the whole-dataset assets in one run on the instance `dagster dev` serves: a tiny
trained_model, an edge_model whose preprocessing does not match training (so its parity gate fails), champion_model's
decision, images from the bilingual demo prompts (the quick stand-in generator), and the report. The held-back
version is then promoted by hand, a batch without labels is scored and queued, and the report made again. The docs
server runs as `make dev` starts it.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import requests
from dagster_dev import REPO, dagster_dev, free_port  # noqa: F401 (fixture)
from support.docs_server import docs_server
from support.training_data import png, synthetic_cell

CHROMIUM = os.environ.get("DGX_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(os.environ.get("DGX_SCREENSHOTS") or REPO / ".dgx" / "screenshots")
BATCHES = ("b0", "b1")
LOCAL = ("http://127.0.0.1", "data:", "blob:", "about:")  # all a page may ask for: no file://, no internet
PRODUCTION = "line-7"  # a batch from the line: images without a label folder
WHOLE = ("trained_model", "edge_model", "champion_model", "ernie_generated_images", "quality_report")


def _landing(landing: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    for batch_index, batch in enumerate(BATCHES):
        for index in range(80):
            defective = rng.random() < (0.5 if batch_index == 0 else 0.2)  # a label-balance shift to flag
            folder = landing / batch / ("defective" if defective else "functional")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"cell{index:03d}.png").write_bytes(png(synthetic_cell(rng, defective)))


def _materialize(instance, generator: Path) -> dg.ExecuteInProcessResult:
    """raw_images (+ GE checks) and image_features per batch, then the whole-dataset assets in one run, as
    "Materialize all" does; the edge model divides by 255 although the network rescales itself, so every image
    reaches it nearly black and the parity gate holds the version back."""
    from dgx_assets import settings
    from dgx_assets.definitions import defs as code_location

    defs = code_location()
    from dgx_assets.generation.prompts import write_demo_prompts

    instance.add_dynamic_partitions("image_batches", list(BATCHES))
    write_demo_prompts(settings.environment().prompts_uri, width=64, height=64)
    job = defs.resolve_implicit_global_asset_job_def()
    features = {"image_height": 32, "image_width": 32, "batch_rows": 64, "embedding": "none"}
    for batch in BATCHES:
        result = job.execute_in_process(
            instance=instance,
            partition_key=batch,
            raise_on_error=False,
            asset_selection=[dg.AssetKey("raw_images"), dg.AssetKey("image_features")],
            run_config={"ops": {"image_features": {"config": features}}},
        )
        assert result.success, batch
    # Small, yet it learns the cracks (93 % against a 76 % majority): a model answering one class would agree
    # with any edge model, broken or not.
    training = {"backbone": "scratch", "width": 8, "epochs": 10, "batch_size": 16, "patience": 10, "warmup_epochs": 0}
    run_config = {
        "ops": {
            # The gate under test is edge_model's: trained_model's passes whatever this small model reaches.
            "trained_model": {"config": training | {"min_margin_over_baseline": -1.0}},
            "edge_model": {"config": {"quantization": "float32", "input_scale": 1 / 255, "latency_images": 5}},
            "ernie_generated_images": {"config": {"default_width": 64, "default_height": 64}},
        },
        "resources": {"ernie": {"config": {"model_dir": str(generator), "build_if_missing": False, "local_instances": 1}}},
    }
    whole = job.execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=[dg.AssetKey(k) for k in WHOLE], run_config=run_config
    )
    assert whole.success, "a held-back version is a decision, not a failed run"
    assert all(whole.asset_materializations_for_node(name) for name in WHOLE)
    decision = whole.asset_materializations_for_node("champion_model")[0].metadata
    assert decision["decision"].value == "held back", decision
    _score_a_production_batch(instance, job, features)
    return whole


def _score_a_production_batch(instance, job, features: dict) -> None:
    """A person promotes the held-back version by hand in MLflow; then a batch lands from the line without labels
    and is scored, queued with its Grad-CAM pictures, and the report made again."""
    import numpy as np
    from mlflow import MlflowClient

    from dgx_assets import settings

    client = MlflowClient(settings.environment().mlflow_tracking_uri)
    candidate = client.get_model_version_by_alias("dgx_defect_classifier", "candidate")
    client.set_registered_model_alias("dgx_defect_classifier", "champion", candidate.version)
    rng = np.random.default_rng(11)
    line = Path(settings.environment().landing_uri) / PRODUCTION
    line.mkdir(parents=True)
    for index in range(24):
        (line / f"camera{index:03d}.png").write_bytes(png(synthetic_cell(rng, rng.random() < 0.3)))
    instance.add_dynamic_partitions("image_batches", [PRODUCTION])
    keys = [dg.AssetKey(name) for name in ("raw_images", "image_features", "defect_predictions", "review_queue")]
    config = {"ops": {"image_features": {"config": features}, "review_queue": {"config": {"size": 6}}}}
    scored = job.execute_in_process(instance=instance, partition_key=PRODUCTION, asset_selection=keys, run_config=config)
    assert scored.asset_materializations_for_node("review_queue")[0].metadata["tasks"].value == 6
    assert job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("quality_report")]).success


@pytest.fixture
def mlflow_ui(tmp_path):
    """MLflow's UI on 127.0.0.1 over the state folder's store, stopped by its process group."""
    port, store = free_port(), tmp_path / "state" / "mlflow.db"
    log = open(tmp_path / "mlflow-ui.log", "w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", process, tmp_path / "mlflow-ui.log"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def _wait_for(url: str, process, log: Path, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if requests.get(url, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    pytest.fail(f"{url} did not answer: {log.read_text()[-3000:]}")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: make e2e installs it")
def test_what_a_user_opens_after_a_held_back_run(dagster_dev, mlflow_ui, quick_model, tmp_path, monkeypatch):  # noqa: F811
    from playwright.sync_api import sync_playwright

    url, lake = dagster_dev
    dagster_ui = url.removesuffix("/graphql")
    mlflow_url, mlflow_process, mlflow_log = mlflow_ui
    docs_port = free_port()
    # The same places `dagster dev` uses, and links pointing at the servers this test started.
    places = {
        "DGX_LAKE_ROOT": str(lake),
        "DGX_STATE_DIR": str(tmp_path / "state"),
        "DGX_DAGSTER_UI_URL": dagster_ui,
        "DGX_MLFLOW_UI_URL": mlflow_url,
        "DGX_DOCS_URL": f"http://127.0.0.1:{docs_port}",
    }
    for name, value in places.items():
        monkeypatch.setenv(name, value)
    _landing(lake / "landing")
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        _materialize(instance, quick_model)
    _wait_for(f"{mlflow_url}/health", mlflow_process, mlflow_log)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with docs_server(docs_port, places, tmp_path / "docs-server.log") as (docs_url, _), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            outside = []  # an air-gapped cluster reaches nothing but its own servers
            page.on(
                "request",
                lambda r: (
                    outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")) else None
                ),
            )
            _dagster_pages(page, dagster_ui, mlflow_url)
            links = _report(page, dagster_ui, docs_url)
            _mlflow_pages(page, links, dagster_ui)
            _data_docs(page, links["Great Expectations data docs"], docs_url)
            assert not outside, f"pages asked for outside addresses: {sorted(set(outside))[:10]}"
        finally:
            browser.close()


def _dagster_pages(page, dagster_ui: str, mlflow_url: str) -> None:
    # 1. The global asset graph with every asset on screen. Dagster opens it with the groups collapsed:
    #    "Expand all groups" (its shortcut, ⌥E, as the README tells a user).
    page.goto(f"{dagster_ui}/asset-groups", wait_until="networkidle")
    _skip_first_visit_dialog(page)
    page.locator("[class*='AssetNode'], [class*='GroupNode'], svg").first.wait_for(timeout=60_000)
    page.keyboard.press("Alt+e")
    missing = _graph_shows(page, _asset_names())
    page.screenshot(path=str(SCREENSHOTS / "1-asset-graph.png"))
    assert not missing, f"the asset graph does not show {missing}"

    # 2. trained_model's page: its latest materialization links to the MLflow run and model version.
    page.goto(f"{dagster_ui}/assets/trained_model", wait_until="networkidle")
    page.locator(f"a[href^='{mlflow_url}/#/experiments/']").first.wait_for(timeout=60_000)
    assert page.locator(f"a[href^='{mlflow_url}/#/models/']").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "2-trained-model-asset.png"))

    # 3. champion_model's page reads "held back", with the version, "stays candidate" and the gate's own reason.
    page.goto(f"{dagster_ui}/assets/champion_model", wait_until="networkidle")
    page.get_by_text("not promoted, stays candidate", exact=False).first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    assert "held back" in text and "edge_model.parity" in text and "to_fix" in text and "quantization: auto" in text, text[:3000]
    page.screenshot(path=str(SCREENSHOTS / "3-champion-held-back.png"), full_page=True)


def _report(page, dagster_ui: str, docs_url: str) -> dict[str, str]:
    """4. quality_report's `report` link in Dagster opens the report over http; its first screen; CJK prompts."""
    page.goto(f"{dagster_ui}/assets/quality_report", wait_until="networkidle")
    report_link = page.locator(f"a[href='{docs_url}/quality_report/report.html']").first
    report_link.wait_for(timeout=60_000)
    page.screenshot(path=str(SCREENSHOTS / "4-quality-report-asset.png"))
    page.goto(report_link.get_attribute("href"), wait_until="load")
    first_screen = page.inner_text("body")
    assert "Verdict: FAIL" in first_screen and "Promotion: held back" in first_screen
    assert "not promoted, stays candidate" in first_screen and "label balance shifted: batch b0" in first_screen
    assert page.locator("#verdict code").count() >= 1  # the reason's Markdown rendered, not raw backticks
    assert page.locator("#links").bounding_box()["y"] < 1000  # on the first screen
    items = page.locator("#links ~ ul li")  # "name: <a href=url>url</a>"
    hrefs = {
        items.nth(i).inner_text().partition(": ")[0]: items.nth(i).locator("a").get_attribute("href")
        for i in range(items.count())
    }
    assert hrefs and all(h.startswith("http://127.0.0.1") for h in hrefs.values()), hrefs  # no file:// left
    page.screenshot(path=str(SCREENSHOTS / "5-report-first-screen.png"))
    failed = page.locator("#gates + p + table tr.failed")
    assert failed.count() >= 1 and "FAILED" in failed.first.inner_text()  # the held-back gate's row, marked
    page.locator("#gates").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "5b-report-gated-figures.png"))
    page.locator("#other-checks").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "5c-report-other-checks.png"))
    decided = page.locator("#decision a").first.get_attribute("href")
    assert decided.startswith(f"{dagster_ui}/runs/")  # the run that made the decision, not a report-only run
    _cjk_glyphs(page)
    _production(page)
    return hrefs


def _production(page) -> None:
    """The production section: the line's batch scored, and its review queue's saliency pictures drawn."""
    page.locator("#production").scroll_into_view_if_needed()
    assert PRODUCTION in page.inner_text("#production-1")
    pictures = page.locator("figure.review img.saliency")
    assert pictures.count() >= 1
    pictures.first.scroll_into_view_if_needed()
    assert pictures.first.evaluate("img => img.complete && img.naturalWidth > 0"), "the saliency picture did not render"
    page.screenshot(path=str(SCREENSHOTS / "7-report-production.png"))


def _cjk_glyphs(page) -> None:
    """The Chinese prompts are drawn with a CJK font's glyphs, not empty boxes: the fonts Chromium used for a
    caption, through the DevTools protocol (make e2e installs Debian's fonts-noto-cjk)."""
    caption = page.locator("figcaption[lang='zh-Hans']").first
    caption.scroll_into_view_if_needed()
    page.locator("#generated").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "6-report-generated-images.png"))
    han = len(re.findall(r"[\u3400-\u9fff]", caption.inner_text()))
    session = page.context.new_cdp_session(page)
    session.send("DOM.enable")
    session.send("CSS.enable")
    root = session.send("DOM.getDocument")["root"]["nodeId"]
    node = session.send("DOM.querySelector", {"nodeId": root, "selector": "figcaption[lang='zh-Hans']"})["nodeId"]
    fonts = session.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    cjk = sum(font["glyphCount"] for font in fonts if "CJK" in font["familyName"] or "Han" in font["familyName"])
    assert han and cjk >= han, f"{han} Chinese characters drawn with {fonts}: install fonts-noto-cjk (make e2e does)"


def _training_view(page) -> None:
    """MLflow 3.17's sidebar in its model-training view offers the model registry, in its GenAI view prompts."""
    page.get_by_role("link", name="Model registry").first.wait_for(timeout=60_000)
    assert page.get_by_role("link", name="Prompts").count() == 0, page.url


def _mlflow_pages(page, links: dict[str, str], dagster_ui: str) -> None:
    """5. Every MLflow link of the report opens the model-training view. MLflow's pages keep polling the server,
    so they never go network-idle: wait for what each shows instead."""
    page.goto(links["MLflow training runs"], wait_until="domcontentloaded")
    page.get_by_text("trained_model-", exact=False).first.wait_for(timeout=60_000)
    _training_view(page)
    page.screenshot(path=str(SCREENSHOTS / "7-mlflow-training-runs.png"))

    page.goto(links["MLflow run of trained_model"], wait_until="domcontentloaded")
    page.locator(f"a[href^='{dagster_ui}/runs/']").first.wait_for(timeout=60_000)  # its description links back
    _training_view(page)
    page.screenshot(path=str(SCREENSHOTS / "8-mlflow-run.png"))

    page.goto(links["MLflow model version"], wait_until="domcontentloaded")
    criterion = page.get_by_text("dgx.gate.edge_model.parity.negative_flip_rate").first
    criterion.wait_for(timeout=60_000)
    _training_view(page)
    criterion.scroll_into_view_if_needed()  # the tags table scrolls inside the page: show the decision's tags
    assert page.get_by_text("held back", exact=True).count() >= 1  # the decision, tagged on the version
    page.screenshot(path=str(SCREENSHOTS / "9-mlflow-model-version.png"), full_page=True)


def _data_docs(page, url: str, docs_url: str) -> None:
    """6. GE's data docs over http, offline: every validation named asset.check[batch]."""
    assert url.startswith(f"{docs_url}/data-docs/"), url
    page.goto(url, wait_until="load")
    page.get_by_text("raw_images.valid_image_share[b1]").first.wait_for(timeout=30_000)
    assert page.locator("table tbody tr").count() >= 8  # 4 checks x 2 batches
    page.screenshot(path=str(SCREENSHOTS / "10-ge-data-docs.png"))


def _skip_first_visit_dialog(page) -> None:
    """Dagster asks a first visitor for an email once its GraphQL has answered, which can be after the page went
    network-idle; left open, its backdrop takes every later click."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    skip = page.get_by_role("button", name="Skip")
    try:
        skip.first.wait_for(timeout=20_000)
    except PlaywrightTimeout:
        return  # this DAGSTER_HOME has seen the dialog before
    skip.first.click()
    skip.first.wait_for(state="detached", timeout=10_000)


def _asset_names() -> list[str]:
    from dgx_assets.definitions import defs as code_location

    defs = code_location()

    graph = defs.resolve_asset_graph()
    return sorted(key.to_user_string() for key in graph.get_all_asset_keys() if graph.get(key).is_materializable)


def _graph_shows(page, names: list[str], seconds: float = 60) -> list[str]:
    """The assets whose node is not inside the window; zooms out while some lie beyond its edges. Zoomed out,
    Dagster shortens long names in the middle (ernie_gene…_images)."""
    deadline, missing = time.time() + seconds, names
    viewport = page.viewport_size
    toolbar = page.get_by_text("Search and filter assets").first.bounding_box()  # the graph's panel starts below
    left, top = toolbar["x"] - 60, toolbar["y"] + toolbar["height"] + 10
    while time.time() < deadline:
        nodes = page.locator("[class*='AssetNode_assetName']")
        shown = []
        for index in range(nodes.count()):
            box = nodes.nth(index).bounding_box()
            if (
                box
                and box["x"] >= left
                and box["y"] >= top
                and box["x"] + box["width"] <= viewport["width"]
                and box["y"] + box["height"] <= viewport["height"]
            ):
                shown.append(nodes.nth(index).inner_text().strip())
        missing = [name for name in names if not any(_abbreviates(label, name) for label in shown)]
        if not missing:
            return []
        if len(shown) == nodes.count() and nodes.count():
            time.sleep(1)  # every node inside, some asset not yet drawn
        else:
            page.locator("button:has([aria-label='zoom_out'])").click()
            time.sleep(0.5)
    return missing


def _abbreviates(label: str, name: str) -> bool:
    if "…" not in label:
        return label == name
    head, tail = label.split("…", 1)
    return name.startswith(head) and name.endswith(tail) and len(head) + len(tail) < len(name)
