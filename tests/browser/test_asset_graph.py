"""`make e2e`: Debian's chromium, driven by Playwright, opens the asset graph and finds every asset."""

import os
import shutil
import time

import pytest
from dagster_dev import dagster_dev  # noqa: F401 (fixture)

ASSETS = ["raw_images", "image_features", "trained_model", "edge_model", "ernie_generated_images", "quality_report"]
CHROMIUM = os.environ.get("DGX_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: make e2e installs it")
def test_asset_graph_shows_every_asset(dagster_dev, tmp_path):
    from playwright.sync_api import sync_playwright

    url, _ = dagster_dev
    base = url.removesuffix("/graphql")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{base}/asset-groups", wait_until="networkidle")
            skip = page.get_by_role("button", name="Skip")  # the first-visit newsletter dialog
            if skip.count():
                skip.first.click()
            deadline, missing = time.time() + 90, ASSETS
            while time.time() < deadline and missing:
                text = page.inner_text("body")
                missing = [asset for asset in ASSETS if asset not in text]
                time.sleep(1)
            page.screenshot(path=str(tmp_path / "asset-graph.png"), full_page=True)
            assert not missing, f"the asset graph does not show {missing}"
        finally:
            browser.close()
