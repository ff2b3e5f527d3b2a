"""`make e2e`: Debian's chromium, driven by Playwright, walks what a user opens after a run: the asset graph
(every asset visible), an asset page with its MLflow link, MLflow opening on the training runs, the quality
report's first screen, and GE's data docs index, offline. Screenshots of each are kept under
`.dgx/screenshots/` (CI keeps them as artifacts).

Builds what it needs quickly and for real: two small landing batches, raw_images with its GE checks,
image_features and a tiny trained_model in-process on the instance `dagster dev` serves, then the report.
"""

import os
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
from support.training_data import png, synthetic_cell

CHROMIUM = os.environ.get("DGX_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(os.environ.get("DGX_SCREENSHOTS") or REPO / ".dgx" / "screenshots")
BATCHES = ("b0", "b1")


def _landing(landing: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    for batch_index, batch in enumerate(BATCHES):
        for index in range(80):
            defective = rng.random() < (0.5 if batch_index == 0 else 0.2)  # a label-balance shift to flag
            folder = landing / batch / ("defective" if defective else "functional")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"cell{index:03d}.png").write_bytes(png(synthetic_cell(rng, defective)))


def _materialize(instance) -> None:
    """raw_images (+ GE checks) and image_features per batch, a tiny trained_model, the report: as make demo does."""
    from dgx_assets.definitions import defs

    instance.add_dynamic_partitions("image_batches", list(BATCHES))
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
    training = {"backbone": "scratch", "width": 8, "epochs": 2, "batch_size": 32, "patience": 2, "warmup_epochs": 0}
    job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        asset_selection=[dg.AssetKey("trained_model")],
        run_config={"ops": {"trained_model": {"config": training}}},
    )
    assert instance.get_latest_materialization_event(dg.AssetKey("trained_model")) is not None
    result = job.execute_in_process(instance=instance, raise_on_error=False, asset_selection=[dg.AssetKey("quality_report")])
    assert result.asset_materializations_for_node("quality_report")


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
def test_what_a_user_opens_after_a_run(dagster_dev, mlflow_ui, tmp_path, monkeypatch):  # noqa: F811 (the fixture)
    from playwright.sync_api import sync_playwright

    url, lake = dagster_dev
    dagster_ui = url.removesuffix("/graphql")
    mlflow_url, mlflow_process, mlflow_log = mlflow_ui
    # The same places `dagster dev` uses, and links pointing at the servers this test started.
    for name, value in {
        "DGX_LAKE_ROOT": str(lake),
        "DGX_STATE_DIR": str(tmp_path / "state"),
        "DGX_DAGSTER_UI_URL": dagster_ui,
        "DGX_MLFLOW_UI_URL": mlflow_url,
    }.items():
        monkeypatch.setenv(name, value)
    _landing(lake / "landing")
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        _materialize(instance)
    _wait_for(f"{mlflow_url}/health", mlflow_process, mlflow_log)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    report = lake / "quality_report" / "report.html"
    docs = tmp_path / "state" / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            outside = []  # an air-gapped cluster reaches nothing but its own servers and files
            page.on(
                "request",
                lambda r: (
                    outside.append(r.url)
                    if not r.url.startswith(("http://127.0.0.1", "file://", "data:", "blob:", "about:"))
                    else None
                ),
            )

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
            run_link = page.locator(f"a[href^='{mlflow_url}/#/experiments/']").first
            run_link.wait_for(timeout=60_000)
            assert page.locator(f"a[href^='{mlflow_url}/#/models/']").count() >= 1
            page.screenshot(path=str(SCREENSHOTS / "2-trained-model-asset.png"))

            # 3. The link opens the MLflow run in the model-training view: its description links back to Dagster.
            # MLflow's page keeps polling the server, so it never goes network-idle: wait for its link instead.
            page.goto(run_link.get_attribute("href"), wait_until="domcontentloaded")
            back = page.locator(f"a[href^='{dagster_ui}/runs/']").first
            back.wait_for(timeout=60_000)
            page.screenshot(path=str(SCREENSHOTS / "3-mlflow-run.png"))

            # 4. Its experiment opens on the training runs, not on the GenAI overview (0 traces).
            page.get_by_role("link", name="Runs").first.click()
            page.get_by_text("trained_model-", exact=False).first.wait_for(timeout=60_000)
            assert "workflowType=machine_learning" in page.url and "/overview" not in page.url, page.url
            page.screenshot(path=str(SCREENSHOTS / "4-mlflow-training-runs.png"))

            # 5. The report's first screen: verdict, key figures and links a browser opens.
            page.goto(report.as_uri(), wait_until="load")
            first_screen = page.inner_text("body")
            assert "Verdict: " in first_screen and "label balance shifted: batch b0" in first_screen
            links = page.locator("#links ~ ul a")
            hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
            assert hrefs and all(h.startswith(("http://127.0.0.1", "file://")) for h in hrefs), hrefs
            assert page.locator("#links").bounding_box()["y"] < 1000  # on the first screen
            page.screenshot(path=str(SCREENSHOTS / "5-report-first-screen.png"))

            # 6. GE's data docs index, offline: every validation named asset.check[batch].
            page.goto(docs.as_uri(), wait_until="load")
            page.get_by_text("raw_images.valid_image_share[b1]").first.wait_for(timeout=30_000)
            assert page.locator("table tbody tr").count() >= 8  # 4 checks x 2 batches
            page.screenshot(path=str(SCREENSHOTS / "6-ge-data-docs.png"))
            assert not outside, f"pages asked for outside addresses: {sorted(set(outside))[:10]}"
        finally:
            browser.close()


def _skip_first_visit_dialog(page) -> None:
    skip = page.get_by_role("button", name="Skip")  # the newsletter dialog of a first visit
    if skip.count():
        skip.first.click()


def _asset_names() -> list[str]:
    from dgx_assets.definitions import defs

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
