"""The serving process over real HTTP on 127.0.0.1: both wire formats, limits, token, status, metrics."""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import time

import pytest
import requests
from PIL import Image
from serving_probe import OPENAI, PIPELINE, metric, metric_samples
from support import serving_engines


def openai(server, body, **kwargs):
    return requests.post(server.url + OPENAI, json=body, timeout=60, **kwargs)


def pipeline(server, fields: dict, **kwargs):
    body = {"key": list(fields), "value": [str(v) for v in fields.values()]}
    return requests.post(server.url + PIPELINE, json=body, timeout=60, **kwargs)


def pipeline_values(reply: dict) -> dict:
    return dict(zip(reply["key"], reply["value"]))


def decode_png(b64: str) -> Image.Image:
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_status_reports_ready_with_routes(server):
    reply = requests.get(server.url + "/status", timeout=5)
    assert reply.status_code == 200
    status = reply.json()
    assert status["status"] == "ready"
    assert status["pid"] == server.pid
    assert set(status["routes"]) == {OPENAI, PIPELINE}
    assert status["max_prompt_tokens"] == 256


def test_openai_protocol_returns_png_of_requested_size_deterministic_by_seed(server):
    body = {"prompt": "electroluminescence image of a defective mono solar cell", "size": "96x64", "seed": 7}
    first, again = openai(server, body), openai(server, body)
    other_seed = openai(server, dict(body, seed=8))
    assert first.status_code == 200, first.text
    image = decode_png(first.json()["data"][0]["b64_json"])
    assert image.size == (96, 64) and image.mode == "L"
    assert first.json()["data"][0]["b64_json"] == again.json()["data"][0]["b64_json"]
    assert other_seed.json()["data"][0]["b64_json"] != first.json()["data"][0]["b64_json"]
    assert first.json()["truncated"] is False and first.json()["seed"] == 7


def test_openai_protocol_returns_n_images(server):
    reply = openai(server, {"prompt": "poly cell", "size": "32x32", "n": 3, "seed": 1})
    images = [decode_png(item["b64_json"]) for item in reply.json()["data"]]
    assert len(images) == 3 and all(image.size == (32, 32) for image in images)
    assert len({image.tobytes() for image in images}) == 3  # each image gets its own noise


def test_pipeline_protocol_round_trip(server):
    reply = pipeline(server, {"prompt": "functional poly cell", "width": 48, "height": 80, "seed": 3})
    assert reply.status_code == 200
    payload = reply.json()
    assert payload["err_no"] == 0 and payload["err_msg"] == ""
    values = pipeline_values(payload)
    assert decode_png(values["image"]).size == (48, 80)
    assert values["truncated"] == "false" and values["seed"] == "3"
    assert all(isinstance(v, str) for v in payload["value"])  # pipeline values travel as strings


def test_pipeline_echoes_logid(server):
    body = {"key": ["prompt", "width", "height"], "value": ["cell", "32", "32"], "logid": 4242}
    assert requests.post(server.url + PIPELINE, json=body, timeout=30).json()["logid"] == 4242


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_over_long_prompt_is_truncated_and_flagged(server, protocol):
    words = [f"word{i}" for i in range(300)]
    prompt = "a defective cell " + " ".join(words)
    if protocol == "openai":
        reply = openai(server, {"prompt": prompt, "size": "32x32", "seed": 1}).json()
        truncated, used, tokens = reply["truncated"], reply["data"][0]["revised_prompt"], reply["usage"]["input_tokens"]
    else:
        values = pipeline_values(pipeline(server, {"prompt": prompt, "width": 32, "height": 32}).json())
        truncated, used, tokens = values["truncated"] == "true", values["used_prompt"], int(values["prompt_tokens"])
    assert truncated is True
    assert tokens == 303
    assert prompt.startswith(used) and used.endswith("word252")  # 3 + 253 words = the 256-token limit


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_quotes_backslashes_newlines_and_chinese_arrive_intact(server, protocol):
    prompt = 'He said "defective" \\ not \'functional\'\n第二行：有缺陷的单晶硅电池片 {"json": [1]}'
    if protocol == "openai":
        reply = openai(server, {"prompt": prompt, "size": "32x32"}).json()
        used = reply["data"][0]["revised_prompt"]
    else:
        used = pipeline_values(pipeline(server, {"prompt": prompt, "width": 32, "height": 32}).json())["used_prompt"]
    assert used == prompt


def test_invalid_utf8_and_lone_surrogates_are_cleaned_not_crashed_on(server):
    raw = b'{"prompt": "defective \xff\xfe cell", "size": "32x32"}'
    reply = requests.post(server.url + OPENAI, data=raw, headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 200
    assert reply.json()["data"][0]["revised_prompt"] == "defective \ufffd\ufffd cell"
    surrogate = b'{"prompt": "mono \\ud800 cell\\u0000", "size": "32x32"}'
    reply = requests.post(server.url + OPENAI, data=surrogate, timeout=30)
    assert reply.status_code == 200
    assert reply.json()["prompt_cleaned"] is True
    assert reply.json()["data"][0]["revised_prompt"] == "mono ? cell"


@pytest.mark.parametrize(
    "body, code, words",
    [
        ({"size": "32x32"}, 5001, "prompt"),
        ({"prompt": "   "}, 5001, "empty"),
        ({"prompt": 42}, 5001, "string"),
        ({"prompt": "cell", "size": "0x0"}, 5002, "outside"),
        ({"prompt": "cell", "size": "100000x100000"}, 5002, "outside"),
        ({"prompt": "cell", "size": "2048x2049"}, 5002, "outside"),
        ({"prompt": "cell", "size": "big"}, 5002, "1024x768"),
        ({"prompt": "cell", "size": "32x32", "n": 1000}, 5003, "n must be"),
        ({"prompt": "cell", "size": "32x32", "seed": -1}, 5004, "seed"),
        ({"prompt": "cell", "size": "32x32", "seed": "x"}, 5004, "seed"),
        ({"prompt": "cell", "size": "32x32", "num_inference_steps": 10**6}, 5005, "steps"),
        ({"prompt": "cell", "size": "32x32", "response_format": "url"}, 5006, "b64_json"),
    ],
)
def test_bad_openai_requests_get_400_with_a_clear_message(server, body, code, words):
    reply = openai(server, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == code and words in error["message"]


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"key": ["prompt"], "value": []}', "same length"),
        (b'{"key": ["prompt", "width", "height"], "value": ["cell", "-5", "32"]}', "outside"),
        (b'{"key": ["prompt", "width", "height"], "value": ["cell", "1e9", "32"]}', "width"),
        (b'{"key": ["seed"], "value": [' + b"9" * 5000 + b"]}", "acceptable JSON"),
        (b"[" * 5000 + b"]" * 5000, "acceptable JSON"),
        (b'{"key": "prompt", "value": "cell"}', "lists"),
    ],
)
def test_bad_pipeline_requests_get_err_no_in_the_5000_range(server, raw, words):
    reply = requests.post(server.url + PIPELINE, data=raw, timeout=30)
    assert reply.status_code == 400
    payload = reply.json()
    assert 5000 <= payload["err_no"] < 6000 and words in payload["err_msg"]
    assert payload["key"] == [] and payload["value"] == []


def test_oversized_body_is_refused_without_being_read(server):
    # Announce 200 MB and send nothing: the reply must come at once, from the header alone.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.putrequest("POST", OPENAI)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(200 * 1024 * 1024))
    connection.endheaders()
    reply = connection.getresponse()
    assert reply.status == 413
    assert "limit" in json.loads(reply.read())["error"]["message"]
    assert reply.getheader("Connection") == "close"
    connection.close()


def test_the_default_body_limit_is_a_few_requests_not_megabytes(server):
    """A real request is a few KB; 20 KB of prompt is refused (the old default took 100 MB)."""
    reply = openai(server, {"prompt": "cell " * 4000, "size": "32x32"})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == 5010


def test_missing_content_length_is_refused_and_chunked_bodies_are_read(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 411")
    body = json.dumps({"prompt": "cell", "size": "32x32", "seed": 1}).encode()
    chunks = (f"{len(body) - 10:x}\r\n").encode() + body[:-10] + b"\r\n" + b"a\r\n" + body[-10:] + b"\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_chunked_body_is_cut_off_at_the_limit(server):
    """No Content-Length to refuse from: the server counts while reading and stops at the limit."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /ernie_image/prediction HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 4096
        reply = b""
        try:
            for _ in range(64):  # 256 KB offered against the 16 KB limit
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before all of it was sent
        while not reply.endswith(b"}"):
            data = sock.recv(4096)
            if not data:
                break
            reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(body)["err_no"] == 5010


def test_unknown_routes_and_methods_get_json_errors_in_the_routes_format(server):
    missing = requests.get(server.url + "/nope", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 5012
    slash = requests.get(server.url + "/status/", timeout=5, allow_redirects=False)
    assert slash.status_code == 404 and slash.json()["error"]["code"] == 5012  # no HTML-less 307
    assert requests.post(server.url + "/other_service/prediction", json={}, timeout=5).status_code == 404
    wrong_method = requests.get(server.url + OPENAI, timeout=5)
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "POST"
    assert wrong_method.json()["error"]["code"] == 5013
    on_pipeline = requests.get(server.url + PIPELINE, timeout=5)
    assert on_pipeline.status_code == 405 and on_pipeline.json()["err_no"] == 5013  # the pipeline's own format


@pytest.mark.parametrize("method", ["TRACE", "OPTIONS", "PUT", "DELETE", "PATCH", "BREW"])
@pytest.mark.parametrize("path", ["/status", OPENAI, PIPELINE])
def test_other_methods_get_json_405_not_html(server, method, path):
    reply = requests.request(method, server.url + path, timeout=5)
    assert reply.status_code == 405
    assert reply.headers["Content-Type"].startswith("application/json")
    payload = reply.json()
    assert (payload["err_no"] if path == PIPELINE else payload["error"]["code"]) == 5013


def test_head_gets_headers_only(server):
    status = requests.head(server.url + "/status", timeout=5)
    assert status.status_code == 200 and status.content == b""
    generation = requests.head(server.url + OPENAI, timeout=5)
    assert generation.status_code == 405 and generation.headers["Content-Type"].startswith("application/json")


def test_unparseable_http_gets_a_json_400(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /\x1b[31mred HTTP/1.1\r\nHost: x\r\n\r\n")  # raw control bytes in the target
        reply = sock.recv(4096)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"]["code"] == 5014


def test_keep_alive_connection_serves_several_requests(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    for seed in range(3):
        body = json.dumps({"prompt": "cell", "size": "32x32", "seed": seed})
        connection.request("POST", OPENAI, body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert reply.status == 200
        reply.read()
    connection.close()


def test_metrics_count_requests_errors_latency_images_and_the_process(server):
    before = metric_samples(server.url)
    openai(server, {"prompt": "cell", "size": "32x32", "n": 2})
    openai(server, {"prompt": "cell", "size": "1x1"})
    after = metric_samples(server.url)
    assert (
        metric(after, "ernie_serving_requests_total", route="openai", code="200")
        == metric(before, "ernie_serving_requests_total", route="openai", code="200") + 1
    )
    errors = "ernie_serving_errors_total"
    assert metric(after, errors, code="5002") == metric(before, errors, code="5002") + 1
    assert (
        metric(after, "ernie_serving_request_duration_seconds_count", route="openai")
        == metric(before, "ernie_serving_request_duration_seconds_count", route="openai") + 2
    )
    assert metric(after, "ernie_serving_images_total") == metric(before, "ernie_serving_images_total") + 2
    assert metric(after, "ernie_serving_in_flight") == 1  # the /metrics request itself
    assert metric(after, "ernie_serving_model_ready") == 1
    assert metric(after, "process_resident_memory_bytes") > 10e6 and metric(after, "process_open_fds") > 0


def test_product_command_line_has_no_benchmark_or_fault_options():
    from dgx_assets.cli import build_parser

    for flags in (["--fixed-latency-ms", "100"], ["--fault", "slow"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--model-dir", "m", *flags])


def test_token_is_required_when_configured(configured_server):
    url = configured_server.url
    body = {"prompt": "cell", "size": "32x32"}
    missing = requests.post(url + OPENAI, json=body, timeout=30)
    wrong = requests.post(url + OPENAI, json=body, headers={"Authorization": "Bearer nope"}, timeout=30)
    wrong_pipeline = requests.post(
        url + PIPELINE, json={"key": ["prompt"], "value": ["cell"]}, headers={"Authorization": "Bearer nope"}, timeout=30
    )
    right = requests.post(url + OPENAI, json=body, headers={"Authorization": "Bearer test-secret-token"}, timeout=30)
    assert missing.status_code == 401 and wrong.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert wrong_pipeline.status_code == 401 and wrong_pipeline.json()["err_no"] == 5100
    assert right.status_code == 200
    assert requests.get(url + "/status", timeout=5).status_code == 200  # probes need no token
    assert requests.get(url + "/metrics", timeout=5).status_code == 401
    assert requests.get(url + "/metrics", headers={"Authorization": "Bearer test-secret-token"}, timeout=5).status_code == 200


def test_config_file_settings_apply(configured_server):
    status = requests.get(configured_server.url + "/status", timeout=5).json()
    assert status["service"] == "ernie_image" and status["device"] == "cpu"
    assert status["engine"] == f"{serving_engines.ENGINES}:fixed_latency"
    started = time.monotonic()
    reply = requests.post(
        configured_server.url + OPENAI,
        json={"prompt": "cell", "size": "32x32"},
        headers={"Authorization": "Bearer test-secret-token"},
        timeout=30,
    )
    assert reply.status_code == 200
    assert time.monotonic() - started >= 0.3  # the fixed-latency engine fixes the model time


def test_fixed_latency_holds_the_predictor_for_each_request(configured_server):
    """One inference thread, two requests at once: the second waits for the first, then holds the full 300 ms
    itself, so the fixed latency caps an instance at 1/latency requests per second, as a real model would."""
    from concurrent.futures import ThreadPoolExecutor

    def post(seed: int) -> int:
        return requests.post(
            configured_server.url + OPENAI,
            json={"prompt": "cell", "size": "32x32", "seed": seed},
            headers={"Authorization": "Bearer test-secret-token"},
            timeout=30,
        ).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(post, [1, 2]))
    assert codes == [200, 200]
    assert time.monotonic() - started >= 0.6
