"""GE's data docs as an air-gapped cluster opens them: no CDN address left, validations named by asset, check, batch."""

import re

import great_expectations as gx

from dgx_assets.quality.expectations import offline_data_docs, run_suite

CDN = re.compile(r'<(?:script|img)[^>]*src="https?://|<link[^>]*href="https?://', re.IGNORECASE)  # loads, not links


def test_data_docs_load_nothing_from_the_internet_and_name_each_validation(started_spark, tmp_path):
    frame = started_spark.createDataFrame([("valid",), ("valid",), ("corrupted",)], "status string")
    for batch in ("b-01", "b-02"):
        expectation = [gx.expectations.ExpectColumnValuesToBeInSet(column="status", value_set=["valid"], mostly=0.5)]
        outcome = run_suite(
            frame, "raw_images_valid_share", expectation, tmp_path / "gx", f"raw_images.valid_image_share[{batch}]"
        )
    assert outcome.success and outcome.data_docs.startswith("file://")

    site = tmp_path / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 3  # the index, the suite, the validations
    for page in pages:
        assert not CDN.search(page.read_text()), f"{page} still loads from a CDN"
    vendor = site / "static" / "vendor"
    assert {p.name for p in vendor.iterdir()} >= {
        "bootstrap.min.css",
        "bootstrap.bundle.min.js",
        "jquery.min.js",
        "bootstrap-table-offline.js",
    }
    assert (vendor / "bootstrap.min.css").stat().st_size > 100_000  # the real Bootstrap, not an empty stand-in
    index = (site / "index.html").read_text()
    assert 'src="static/vendor/jquery.min.js"' in index
    for batch in ("b-01", "b-02"):
        assert f"raw_images.valid_image_share[{batch}]" in index
    assert "__none__" not in index
    validation = next(site.glob("validations/*/*b-02*/*/*.html")).read_text()
    assert "Data asset: dgx_spark-raw_images_valid_share" in validation
    assert offline_data_docs(site) == 0  # idempotent: nothing left to rewrite
