"""The edge runtime on a real (small) int8 TFLite model: a folder of PNGs, HTTP on 127.0.0.1, MLflow fetch."""

from __future__ import annotations

import http.client
import json
import os
import statistics
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from edge_http import running_server
from support.edge_data import CLASS_NAMES, RAW_SIZE

from dgx_assets import cli
from dgx_assets.station.runtime import (
    CONTRACT_FILE,
    MLFLOW_ARTIFACT_DIR,
    MODEL_FILE,
    EdgeClassifier,
    EdgeRuntimeError,
    classify_folder,
)


@pytest.fixture(scope="module")
def model_dir(edge_model_dir):
    return edge_model_dir


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
    results = list(classify_folder(EdgeClassifier(model_dir), image_folder))
    names = [r["file"] for r in results]
    assert ".hidden.png" not in names and "link.png" not in names  # never read through a link
    bad = [r for r in results if "error" in r]
    assert [r["file"] for r in bad] == ["zz-truncated.png"] and "not a readable image" in bad[0]["error"]
    good = [r for r in results if "error" not in r]
    assert len(good) == 40
    correct = sum(r["label"] == r["file"].split("-", 1)[1].removesuffix(".png") for r in good)
    assert correct / len(good) >= 0.9
    assert all(abs(sum(r["probabilities"].values()) - 1) < 0.02 for r in good)


def test_the_model_carries_its_format_and_decision_rule_and_the_runtime_follows_them(
    model_dir, image_folder, tmp_path, trained_classifier
):
    from dgx_assets.station.tflite_metadata import embed_contract, read_contract

    model = (model_dir / MODEL_FILE).read_bytes()
    contract = read_contract(model)
    plain = EdgeClassifier(model_dir)
    assert (plain.format, plain.contract_source, plain.decision_rule) == ("int8", "model metadata", "the most probable class")

    # The same network with a threshold on P(defective) so high that nothing reaches it, and no edge_model.json
    # (a folder holding only the .tflite): every image is then "functional", whatever argmax says.
    folder = tmp_path / "thresholded"
    folder.mkdir()
    strict = contract | {"format": "float16", "decision": {"threshold": 0.999999, "positive_index": 1}}
    (folder / MODEL_FILE).write_bytes(embed_contract(model, strict))
    (folder / CONTRACT_FILE).write_text(json.dumps(contract | {"format": "a file that disagrees"}))
    thresholded = EdgeClassifier(folder)
    assert thresholded.format == "float16" and thresholded.decision_rule == "defective when its probability is at least 0.999999"
    results = [r for r in classify_folder(thresholded, image_folder) if "label" in r]
    assert {r["label"] for r in results} == {"functional"}
    assert any(r["probabilities"]["defective"] > 0.5 for r in results)  # argmax would have said defective

    # A model built before the contract was embedded still runs, from edge_model.json; without it, it is refused.
    from dgx_assets.edge.convert import EdgeConversionConfig, convert_to_tflite

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, quantization="float32")
    (legacy / MODEL_FILE).write_bytes(convert_to_tflite(trained_classifier.model, config))
    with pytest.raises(EdgeRuntimeError, match="has no dgx_edge_contract metadata.*no edge_model.json beside it"):
        EdgeClassifier(legacy)
    (legacy / CONTRACT_FILE).write_text(json.dumps(contract))
    assert EdgeClassifier(legacy).contract_source == CONTRACT_FILE


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
    with running_server(model_dir, max_body_bytes=200_000, socket_timeout_s=5) as server:
        yield server


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
    assert status == 415 and "the station takes PNG, JPEG, BMP, TIFF" in body["error"]
    for wrapper in (b"icns\x00\x00\x01\xae", b"\x00\x00\x01\x00\x01\x00", b"\x00\x00\x00\x0cjP  \r\n\x87\n"):
        status, body = _request(server, "POST", "/v1/classify", wrapper + b"\x00" * 400)  # ICNS, ICO, JPEG 2000
        assert status == 415, wrapper
    status, body = _request(server, "POST", "/v1/classify", contents[0][:60])  # a PNG cut short
    assert status == 422 and "not a readable image" in body["error"]
    both = {"Transfer-Encoding": "chunked", "Content-Length": "1"}  # the budget would count 1 byte of a long body
    status, body = _request(server, "POST", "/v1/classify", b"5\r\nhello\r\n0\r\n\r\n", both)
    assert status == 400 and "not both" in body["error"]  # Content-Length and Transfer-Encoding (RFC 9112 6.3)
    status, body = _request(server, "POST", "/v1/classify", b"x" * 200_001)
    assert status == 413 and "limit" in body["error"]
    status, body = _request(server, "GET", "/v1/classify")
    assert status == 404 and "POST /v1/classify" in body["error"]
    status, body = _request(server, "POST", "/v1/classify", b"", {"Transfer-Encoding": "chunked"})
    assert status == 411


def _log_edge_model(registered_version, model_dir) -> Path:
    """edge_model's files on the version's run, as the build logs them; the .tflite as the artifact store holds it."""
    from mlflow import MlflowClient

    client = MlflowClient(registered_version.tracking_uri)
    for name in (MODEL_FILE, CONTRACT_FILE):
        client.log_artifact(registered_version.run_id, str(model_dir / name), artifact_path=MLFLOW_ARTIFACT_DIR)
    artifacts = Path(urlparse(client.get_run(registered_version.run_id).info.artifact_uri).path)
    return artifacts / MLFLOW_ARTIFACT_DIR / MODEL_FILE


def _fetch_argv(registered_version, out) -> list[str]:
    name, uri = registered_version.model_name, registered_version.tracking_uri
    return ["edge-fetch", "--model-name", name, "--out", str(out), "--tracking-uri", uri, "--version", registered_version.version]


def test_fetch_downloads_a_registered_versions_edge_model(registered_version, model_dir, tmp_path, capsys):
    _log_edge_model(registered_version, model_dir)
    out = tmp_path / "fetched"
    argv = _fetch_argv(registered_version, out)
    assert cli.main(argv) == 0
    assert (out / MODEL_FILE).read_bytes() == (model_dir / MODEL_FILE).read_bytes()
    assert EdgeClassifier(out).source["run_id"] == registered_version.run_id

    assert cli.main([*argv[:-1], "99"]) == 2
    assert "no version '99'" in capsys.readouterr().err


def test_fetch_verifies_the_recorded_digest_and_writes_nothing_on_a_mismatch(registered_version, model_dir, tmp_path, capsys):
    """Was: edge-fetch copied a corrupt model.tflite without checking it against anything."""
    from mlflow import MlflowClient

    from dgx_assets.fleet.fetch import DIGEST_TAG, file_sha256, record_edge_model_digest

    stored = _log_edge_model(registered_version, model_dir)
    rv = registered_version
    digest = record_edge_model_digest(rv.tracking_uri, rv.run_id, model_dir / MODEL_FILE, rv.model_name, rv.version)
    client = MlflowClient(rv.tracking_uri)
    assert client.get_model_version(rv.model_name, rv.version).tags[DIGEST_TAG] == digest == file_sha256(stored)
    assert client.get_run(rv.run_id).data.tags[DIGEST_TAG] == digest

    out = tmp_path / "station" / "current"
    assert cli.main(_fetch_argv(rv, out)) == 0
    assert f"sha256 {digest} verified" in capsys.readouterr().out
    installed = {name: (out / name).read_bytes() for name in os.listdir(out)}

    stored.write_bytes(stored.read_bytes()[:-1] + b"\x00")  # bit rot, or a swapped artifact
    assert cli.main(_fetch_argv(rv, out)) == 2
    err = capsys.readouterr().err
    assert f"but {digest} was recorded when it was built" in err and "nothing was written" in err
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == installed  # the previous model stays
    assert os.listdir(out.parent) == ["current"]  # no staging folder left behind
    assert cli.main(_fetch_argv(rv, tmp_path / "fresh")) == 2 and not (tmp_path / "fresh").exists()


def test_a_version_without_a_digest_has_it_recorded_by_its_first_fetch(registered_version, model_dir, tmp_path, capsys):
    from mlflow import MlflowClient

    from dgx_assets.fleet.fetch import DIGEST_TAG

    stored = _log_edge_model(registered_version, model_dir)
    assert cli.main(_fetch_argv(registered_version, tmp_path / "a")) == 0
    assert "recorded by this fetch" in capsys.readouterr().out
    version = MlflowClient(registered_version.tracking_uri).get_model_version(registered_version.model_name, "1")
    assert version.tags[DIGEST_TAG] == json.loads((tmp_path / "a" / "source.json").read_text())["sha256"]
    stored.write_bytes(b"TFL3 swapped")
    assert cli.main(_fetch_argv(registered_version, tmp_path / "b")) == 2 and "was recorded" in capsys.readouterr().err


def test_fetch_out_problems_are_one_line_errors(registered_version, model_dir, tmp_path, capsys):
    _log_edge_model(registered_version, model_dir)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out, words in ((a_file, "is a file, not a folder"), (a_file / "under", "cannot create its folder")):
        assert cli.main(_fetch_argv(registered_version, out)) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no staging folder left


def test_replies_on_a_kept_alive_connection_are_not_held_back_by_nagle(model_dir):
    """A reply is written in two parts (head, body): without TCP_NODELAY the second waits for the client's
    delayed ACK, 44 ms a request on this machine (0.4 ms with it). The listener is shared with serving."""
    with running_server(model_dir) as server:
        connection = http.client.HTTPConnection(*server.server_address, timeout=10)
        seconds = []
        for _ in range(40):
            started = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            seconds.append(time.perf_counter() - started)
        connection.close()
    assert statistics.median(seconds[10:]) < 0.02  # past Linux's quick-ACK start of a connection
