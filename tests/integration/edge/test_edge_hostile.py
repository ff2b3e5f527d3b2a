"""The edge runtime under hostile clients and files (issue 29's probes), on real servers on 127.0.0.1.

Each probe is bounded: clients give up after a few seconds, every socket is closed by the test, servers in a
process of their own are stopped by PID when the test ends.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from edge_http import blank_png, edge_process, running_server
from support.edge_data import CLASS_NAMES

from dgx_assets import cli
from dgx_assets.fleet.kubeedge import edge_deployment

SLACK_S = 2.0  # scheduling slack on a shared 2-core machine


def post(port: int, body: bytes, timeout: float = 10) -> tuple[int | str, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/v1/classify", body=body)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    except (ConnectionError, TimeoutError) as error:  # refused before the whole body was sent
        return type(error).__name__, {}
    finally:
        connection.close()


def raw_reply(port: int, request: bytes) -> tuple[bytes, dict]:
    """The status line and JSON body of the server's answer to raw request bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)


def pod_memory_limit_mb() -> float:
    [container] = edge_deployment("m", "1")["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    return float(limit[:-2]) * 1.048576  # MiB as MB


def test_pixel_budget_refuses_from_the_header_and_one_request_at_the_budget_fits_the_pod(edge_model_dir, tmp_path):
    """Was: a 329 KB 16-bit 13000x13000 PNG drove the server to 4.4 GB; the manifest gives the pod 512Mi."""
    with edge_process(edge_model_dir, tmp_path / "edge.log") as server:
        started = time.monotonic()
        status, body = post(server.port, blank_png(13000, 13000, 16))
        assert status == 413 and "13000x13000 I;16 image" in body["error"] and "--max-pixels" in body["error"]
        assert time.monotonic() - started < 5 and server.memory_mb() < 150  # never decoded
        # 2896 x 2896 16-bit grey: at the default budget, and the costliest decode per budget pixel.
        status, body = post(server.port, blank_png(2896, 2896, 16), timeout=60)
        assert status == 200 and body["label"] in CLASS_NAMES
        status, health = post_get(server.port, "/healthz")
        assert health["max_pixels"] == 4096 * 4096
        assert health["peak_rss_bytes"] / 1e6 == pytest.approx(server.memory_mb(), rel=0.05)
        assert server.memory_mb() < pod_memory_limit_mb() * 0.8


def post_get(port: int, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_slow_drip_clients_are_cut_at_the_body_deadline_while_others_are_served(edge_model_dir, edge_dataset):
    """Was: four clients sending a body byte every 5 s made every honest request get 503: the timeout was per
    read, and each slow body held a classification slot."""
    image = edge_dataset.select("test")[0][0]
    deadline = 2.0
    stop, cut_after = threading.Event(), []

    def drip(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            started = time.monotonic()
            try:
                while not stop.is_set() and not stop.wait(0.5):
                    sock.sendall(b"x")
            except OSError:
                pass
            reply = sock.recv(4096)
            cut_after.append((time.monotonic() - started, reply.split(b"\r\n")[0]))

    with running_server(edge_model_dir, max_in_flight=4, socket_timeout_s=deadline) as server:
        port = server.server_address[1]
        with ThreadPoolExecutor(4) as pool:
            drips = [pool.submit(drip, port) for _ in range(4)]
            time.sleep(0.3)
            honest = [post(port, image)[0] for _ in range(10)]
            for future in drips:
                future.result(timeout=deadline + 3 * SLACK_S)
            stop.set()
    assert honest == [200] * 10
    assert len(cut_after) == 4
    for seconds, status_line in cut_after:
        assert status_line == b"HTTP/1.1 408 Request Timeout" and seconds < deadline + SLACK_S


def test_bodies_that_do_not_fit_are_refused_before_they_are_buffered(edge_model_dir, edge_dataset, tmp_path):
    """Was: 30 bodies of 20 MB sent while every slot was busy were read in full, and memory grew with them."""
    flags = ["--max-in-flight", "2", "--max-body-bytes", "10000000", "--socket-timeout", "5"]
    with edge_process(edge_model_dir, tmp_path / "edge.log", *flags) as server:
        holders = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2)]
        try:
            for sock in holders:  # two slow bodies of 10 MB hold the whole budget (2 x 10 MB)
                sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\nxx")
            time.sleep(0.5)
            before = server.memory_mb()
            with ThreadPoolExecutor(30) as pool:
                replies = list(pool.map(lambda _: post(server.port, b"x" * 8_000_000, timeout=20)[0], range(30)))
            # Answered 503 from their head (a client still sending may see only the close), never read.
            assert all(reply in (503, "ConnectionResetError", "BrokenPipeError") for reply in replies), replies
            assert server.memory_mb() - before < 40  # 30 x 8 MB were sent: none was kept
            assert holders[0].recv(4096).startswith(b"HTTP/1.1 408")  # cut at the body deadline
        finally:
            for sock in holders:
                sock.close()
        assert post(server.port, edge_dataset.select("test")[0][0])[0] == 200  # the budget is back
    assert (tmp_path / "edge.log").read_text().count('"POST /v1/classify" 503') == 30


def test_ambiguous_content_length_gets_json_400_and_control_characters_never_reach_the_log(edge_model_dir, tmp_path):
    """Was: `Content-Length: ²` got no reply, two different ones were accepted (the first used), and ESC and CR
    bytes of a request line were written raw to the log."""
    log = tmp_path / "edge.log"
    with edge_process(edge_model_dir, log) as server:
        for head in (
            b"Content-Length: \xb2\r\n",  # a superscript two: a digit to str.isdigit
            "Content-Length: ²\r\n".encode(),
            b"Content-Length: 5\r\nContent-Length: 100\r\n",
        ):
            status, body = raw_reply(server.port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n" + head + b"\r\nGIF89")
            assert status == b"HTTP/1.1 400 Bad Request" and body["status"] == 400
        status, _ = raw_reply(server.port, b"GET /\x1b[31mred\rFORGED-LINE HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == b"HTTP/1.1 400 Bad Request"
        status, body = raw_reply(server.port, b"GET /%1b[31mred%0dFORGED-LINE-2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == b"HTTP/1.1 404 Not Found" and "POST /v1/classify" in body["error"]
    text = log.read_bytes()
    assert b"\x1b" not in text and b"\r" not in text
    assert b'"GET /\\x1b[31mred\\x0dFORGED-LINE-2" 404' in text


def _station(tmp_path, edge_dataset, huge_bytes: int):
    folder = tmp_path / "station"
    folder.mkdir()
    contents, labels = edge_dataset.select("test")
    for i in range(3):
        (folder / f"{i}-{labels[i]}.png").write_bytes(contents[i])
    with open(folder / "2b-huge.png", "wb") as handle:  # sparse: costs no disk, only whoever reads it
        handle.truncate(huge_bytes)
    return folder


def test_images_skips_a_file_over_the_size_cap_and_reports_every_other_file(edge_model_dir, edge_dataset, tmp_path, capsys):
    """Was: `--images` read a 2 GB file whole (2.1 GB resident) before finding it was no image."""
    folder = _station(tmp_path, edge_dataset, 2 * 1024**3)
    started = time.monotonic()
    code = cli.main(["edge-run", "--model-dir", str(edge_model_dir), "--images", str(folder)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1 and time.monotonic() - started < 10
    assert [line["file"] for line in lines] == ["0-functional.png", "1-defective.png", "2-functional.png", "2b-huge.png"]
    assert lines[3] == {"file": "2b-huge.png", "skipped": "2147483648 bytes, over the 20971520-byte limit (--max-body-bytes)"}
    assert [line["label"] for line in lines[:3]] == ["functional", "defective", "functional"]


def test_images_out_of_memory_on_one_file_loses_no_other_result(edge_model_dir, edge_dataset, tmp_path):
    """Was: a MemoryError reading one file ended the command with a traceback and no result at all."""
    folder = _station(tmp_path, edge_dataset, 1024**3)

    def small_address_space():  # in the child only: 1 GiB cannot be read into 450 MB
        resource.setrlimit(resource.RLIMIT_AS, (450 * 2**20, 450 * 2**20))

    command = [sys.executable, "-m", "dgx_assets", "edge-run", "--model-dir", str(edge_model_dir), "--images", str(folder)]
    child = subprocess.run(
        [*command, "--max-body-bytes", str(2 * 1024**3)],
        preexec_fn=small_address_space,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = {line["file"]: line for line in map(json.loads, child.stdout.splitlines())}
    assert child.returncode == 1, child.stderr[-2000:]
    assert lines["2b-huge.png"]["error"].startswith("MemoryError")
    assert {lines[name]["label"] for name in ("0-functional.png", "1-defective.png", "2-functional.png")} == set(CLASS_NAMES)


@pytest.mark.parametrize("limit", ["-1", "0", "1.5", "²"])
def test_a_limit_that_is_not_a_positive_count_is_refused(edge_model_dir, tmp_path, limit, capsys):
    """Was: `--limit -1` silently skipped the last file."""
    with pytest.raises(SystemExit) as refused:
        cli.main(["edge-run", "--model-dir", str(edge_model_dir), "--images", str(tmp_path), "--limit", limit])
    assert refused.value.code == 2 and "--limit: must be a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, words",
    [
        ({"class_names": "OK"}, "class_names must be a non-empty list of names, got 'OK'"),
        ({"class_names": ["ok", "ok"]}, "class_names repeats a name"),
        ({"class_names": ["ok", 1]}, "class_names must be a non-empty list"),
        ({"raw_height": True}, "raw_height must be a positive integer"),
        ({"decision": {"threshold": 1.5, "positive_index": 1}}, "decision.threshold must be a probability in (0, 1)"),
        ({"decision": {"threshold": 0.5, "positive_index": 2}}, "decision.positive_index must index one of two classes"),
        ({"decision": {"threshold": 0.5}}, "decision must give both threshold and positive_index"),
    ],
)
def test_a_contract_of_the_wrong_types_is_refused_in_one_line(edge_model_dir, tmp_path, change, words, capsys):
    """Was: a contract with `class_names: "OK"` gave the labels "O" and "K". The contract is the model's own
    metadata, where edge_model puts it."""
    from dgx_assets.station.tflite_metadata import embed_contract, read_contract

    folder = tmp_path / "model"
    folder.mkdir()
    model = (edge_model_dir / "model.tflite").read_bytes()
    (folder / "model.tflite").write_bytes(embed_contract(model, read_contract(model) | change))
    assert cli.main(["edge-run", "--model-dir", str(folder), "--images", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.splitlines()) == 1


def test_a_corrupt_source_json_is_a_one_line_error(edge_model_dir, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.tflite", "edge_model.json"):
        (folder / name).write_bytes((edge_model_dir / name).read_bytes())
    (folder / "source.json").write_bytes(b'{"model_name": "m", "vers')
    assert cli.main(["edge-run", "--model-dir", str(folder), "--images", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "source.json is unreadable" in err and "edge-fetch" in err and len(err.splitlines()) == 1
    assert not any(name.startswith(".") for name in os.listdir(folder))
