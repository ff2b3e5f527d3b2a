"""Every address we write is one a browser opens in the right place: MLflow's model-training view, the docs server."""

from dgx_assets import links


def test_every_mlflow_link_asks_for_the_model_training_view():
    ui = "http://127.0.0.1:5000/"
    for url in (
        links.mlflow_runs(ui, "7"),
        links.mlflow_run(ui, "7", "abc"),
        links.mlflow_model_version(ui, "dgx defect", "3"),
    ):
        assert url.startswith("http://127.0.0.1:5000/#/") and url.endswith("?workflowType=machine_learning"), url
    assert links.mlflow_runs(ui, "7") == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    assert "/#/models/dgx%20defect/versions/3?" in links.mlflow_model_version(ui, "dgx defect", "3")


def test_docs_pages_are_http_addresses_on_the_docs_server():
    assert links.docs_page("http://127.0.0.1:3001/", links.REPORT_ROUTE, links.REPORT_PAGE) == (
        "http://127.0.0.1:3001/quality_report/report.html"
    )
    assert links.docs_page("http://h:1", links.DATA_DOCS_ROUTE, "validations", "a b.html") == (
        "http://h:1/data-docs/validations/a%20b.html"
    )
