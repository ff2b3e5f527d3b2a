"""The edge runtime on a real (small) int8 TFLite model: a folder of PNGs, HTTP on 127.0.0.1, MLflow fetch."""

from __future__ import annotations

import http.client
import json
import os
import threading

import numpy as np
import pytest
from support.edge_data import CLASS_NAMES, MODEL_SIZE, RAW_SIZE

from dgx_assets import cli
from dgx_assets.edge.convert import (
    EdgeConversionConfig,
    convert_to_tflite,
    describe_tflite,
)
from dgx_assets.edge.runtime import (
    CONTRACT_FILE,
    MLFLOW_ARTIFACT_DIR,
    MODEL_FILE,
    EdgeClassifier,
    EdgeRuntimeError,
    classify_folder,
    make_server,
)


@pytest.fixture(scope="module")
def model_dir(trained_classifier, train_raw_images, tmp_path_factory):
    """What edge_model writes: model.tflite and its contract edge_model.json."""
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, representative_samples=100)
    tflite = convert_to_tflite(trained_classifier.model, config, train_raw_images)
    spec = describe_tflite(tflite, CLASS_NAMES, config, (MODEL_SIZE, MODEL_SIZE, 1))
    folder = tmp_path_factory.mktemp("edge_model")
    (folder / MODEL_FILE).write_bytes(tflite)
    (folder / CONTRACT_FILE).write_text(json.dumps({**spec.to_dict(), "raw_height": RAW_SIZE, "raw_width": RAW_SIZE}))
    return folder


@pytest.fixture(scope="module")
def image_folder(edge_dataset, tmp_path_factory):
    contents, labels = edge_dataset.select("test")
    folder = tmp_path_factory.mktemp("station")
    for i, (content, label) in enumerate(zip(contents[:40], labels[:40])):
        (folder / f"{i:03d}-{label}.png").write_bytes(content)
    (folder / "zz-truncated.png").write_bytes(contents[0][:40])  # a camera that stopped mid-write
    (folder / ".hidden.png").write_bytes(contents[0])
    os.symlink("/etc/passwd", folder / "link.png")
    return folder


def test_folder_classification_is_accurate_and_records_bad_files(model_dir, image_folder):
    results = classify_folder(EdgeClassifier(model_dir), image_folder)
    names = [r["file"] for r in results]
    assert ".hidden.png" not in names and "link.png" not in names  # never read through a link
    bad = [r for r in results if "error" in r]
    assert [r["file"] for r in bad] == ["zz-truncated.png"] and "not a readable image" in bad[0]["error"]
    good = [r for r in results if "error" not in r]
    assert len(good) == 40
    correct = sum(r["label"] == r["file"].split("-", 1)[1].removesuffix(".png") for r in good)
    assert correct / len(good) >= 0.9
    assert all(abs(sum(r["probabilities"].values()) - 1) < 0.02 for r in good)


def test_edge_run_command_prints_one_json_line_per_file(model_dir, image_folder, capsys):
    code = cli.main(["edge-run", "--model-dir", str(model_dir), "--images", str(image_folder), "--limit", "3"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(lines) == 3 and all(line["label"] in CLASS_NAMES for line in lines)


def test_a_folder_without_the_model_is_refused_clearly(tmp_path, capsys):
    with pytest.raises(EdgeRuntimeError, match="model.tflite is missing"):
        EdgeClassifier(tmp_path)
    assert cli.main(["edge-run", "--model-dir", str(tmp_path), "--images", str(tmp_path)]) == 2
    assert "edge-fetch" in capsys.readouterr().err


@pytest.fixture
def server(model_dir):
    server = make_server(EdgeClassifier(model_dir), "127.0.0.1", 0, max_body_bytes=200_000, socket_timeout_s=5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _request(server, method, path, body=None, headers=None):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_http_classifies_posted_images_and_answers_json_errors(server, edge_dataset):
    assert server.server_address[0] == "127.0.0.1"
    status, health = _request(server, "GET", "/healthz")
    assert status == 200 and health["class_names"] == CLASS_NAMES and health["input"] == [RAW_SIZE, RAW_SIZE, 1]
    contents, labels = edge_dataset.select("test")
    answers = [_request(server, "POST", "/v1/classify", content) for content in contents[:20]]
    assert all(status == 200 for status, _ in answers)
    assert np.mean([body["label"] == label for (_, body), label in zip(answers, labels[:20])]) >= 0.9

    status, body = _request(server, "POST", "/v1/classify", b"GIF89a not really")
    assert status == 400 and "not a readable image" in body["error"]
    status, body = _request(server, "POST", "/v1/classify", b"x" * 200_001)
    assert status == 413 and "limit" in body["error"]
    status, body = _request(server, "GET", "/v1/classify")
    assert status == 404 and "POST /v1/classify" in body["error"]
    status, body = _request(server, "POST", "/v1/classify", b"", {"Transfer-Encoding": "chunked"})
    assert status == 411


def test_fetch_downloads_a_registered_versions_edge_model(registered_version, model_dir, tmp_path, capsys):
    from mlflow import MlflowClient

    client = MlflowClient(registered_version.tracking_uri)
    for name in (MODEL_FILE, CONTRACT_FILE):
        client.log_artifact(registered_version.run_id, str(model_dir / name), artifact_path=MLFLOW_ARTIFACT_DIR)
    out = tmp_path / "fetched"
    argv = [
        "edge-fetch",
        "--model-name",
        registered_version.model_name,
        "--out",
        str(out),
        "--tracking-uri",
        registered_version.tracking_uri,
    ]
    assert cli.main([*argv, "--version", registered_version.version]) == 0
    assert (out / MODEL_FILE).read_bytes() == (model_dir / MODEL_FILE).read_bytes()
    assert EdgeClassifier(out).source["run_id"] == registered_version.run_id

    assert cli.main([*argv, "--version", "99"]) == 2
    assert "no version '99'" in capsys.readouterr().err
