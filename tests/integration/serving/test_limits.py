"""The serving process under hostile clients (issue 15's probes), on a real server with small limits.

`limited_server` (conftest.LIMITED): one inference thread held 300 ms per request, one request may wait,
60 connections, 1 s to send a request head or a body, 2 s idle keep-alive. Each probe is bounded: the
clients here give up after a few seconds, and every socket is closed by the test.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from serving_probe import LIMITED, OPENAI, PIPELINE, metric, metric_samples
from support.waiting import wait_for

SLACK_S = 2.0  # scheduling slack on a shared 2-core machine, on top of each timeout


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def post_cell(server, seed: int = 1, timeout: float = 30):
    return requests.post(server.url + OPENAI, json={"prompt": "cell", "size": "32x32", "seed": seed}, timeout=timeout)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic)."""
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic()


def test_held_idle_connections_cost_no_threads_and_others_are_served(limited_server):
    """Was: 1,000 held connections made 1,003 threads and 419 MB. Now 50 cost no thread and little memory."""
    pid = limited_server.pid
    post_cell(limited_server)  # warm: the inference thread exists
    threads, rss_kb = proc_status(pid, "Threads"), proc_status(pid, "VmRSS")
    held = [socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) for _ in range(50)]
    try:
        wait_for(lambda: metric(metric_samples(limited_server.url), "ernie_serving_connections") >= 50)
        assert post_cell(limited_server).status_code == 200
        assert proc_status(pid, "Threads") <= threads + 1
        assert proc_status(pid, "VmRSS") - rss_kb < 20 * 1024
    finally:
        for sock in held:
            sock.close()


def test_connections_over_the_cap_get_503_and_are_closed(limited_server):
    extra = 5
    held = [
        socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) for _ in range(LIMITED["max_connections"] + extra)
    ]
    try:
        # The ones over the cap are answered at once; the accepted ones only at the header timeout (408).
        replies = []
        for sock in held:
            sock.settimeout(LIMITED["header_timeout_s"] + SLACK_S)
            replies.append(sock.recv(4096))
        refused = [data for data in replies if data.startswith(b"HTTP/1.1 503")]
        assert extra <= len(refused) <= extra + 2  # the cap counts any connection still closing, too
        assert all(data.startswith(b"HTTP/1.1 408") for data in replies if data not in refused)
        for data in refused:
            head, _, body = data.partition(b"\r\n\r\n")
            assert b"retry-after: 1" in head.lower() and json.loads(body)["error"]["code"] == 6003
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: post_cell(limited_server).status_code == 200)  # capacity comes back with the sockets


def test_slow_loris_connections_are_closed_within_the_header_timeout_while_others_are_served(limited_server):
    """Was: a byte a second kept a connection open past the 60 s per-read timeout, forever."""
    stop = threading.Event()
    closed_after, sending = [], []

    def loris():
        with socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) as sock:
            started, announced = time.monotonic(), False
            try:
                for byte in b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000:
                    if stop.is_set():
                        return
                    sock.send(bytes([byte]))
                    if not announced:  # this one is mid-header now
                        sending.append(True)
                        announced = True
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            data, ended = read_until_closed(sock, 5)
            closed_after.append((ended - started, data))

    with ThreadPoolExecutor(10) as pool:
        lorises = [pool.submit(loris) for _ in range(10)]
        wait_for(lambda: len(sending) == 10, timeout_s=LIMITED["header_timeout_s"], what="every loris mid-header")
        assert post_cell(limited_server).status_code == 200  # others are served meanwhile
        for future in lorises:
            future.result(timeout=LIMITED["header_timeout_s"] + 3 * SLACK_S)
        stop.set()
    assert len(closed_after) == 10
    for seconds, data in closed_after:
        assert seconds < LIMITED["header_timeout_s"] + SLACK_S
        assert data.startswith(b"HTTP/1.1 408")


def test_idle_keep_alive_connections_are_closed(limited_server):
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        answered = time.monotonic()
        data, closed = read_until_closed(sock, LIMITED["keep_alive_s"] + 3 * SLACK_S)
    assert data.startswith(b"HTTP/1.1 200")
    assert LIMITED["keep_alive_s"] - 0.5 <= closed - answered < LIMITED["keep_alive_s"] + SLACK_S


def test_a_body_shorter_than_its_content_length_gets_408_and_never_reaches_the_model(limited_server):
    """Was: left open, it got a 500 "inference failed" after 60 s, which clients retry."""
    before = metric(metric_samples(limited_server.url), "ernie_serving_images_total")
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) as sock:
        sent = time.monotonic()
        sock.sendall(b'POST /ernie_image/prediction HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"key": ["prompt"],')
        data, closed = read_until_closed(sock, LIMITED["body_timeout_s"] + 3 * SLACK_S)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(body)["err_no"] == 6001  # the pipeline route's own format, a timeout code
    assert closed - sent < LIMITED["body_timeout_s"] + SLACK_S
    assert metric(metric_samples(limited_server.url), "ernie_serving_images_total") == before


def test_a_huge_body_is_refused_from_its_header_and_does_not_grow_the_server(limited_server):
    """Was: one 99 MB body raised resident memory from 358 MB to 1.95 GB."""
    pid = limited_server.pid
    rss_kb = proc_status(pid, "VmRSS")
    sent = 0
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Length: 99000000\r\n\r\n")
        block = b"x" * 65536
        try:
            while sent < 99_000_000:
                sock.sendall(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    assert sent < 16 * 1024 * 1024  # the server closed it: only what the kernels buffer got through
    assert proc_status(pid, "VmRSS") - rss_kb < 20 * 1024


def test_a_full_server_answers_503_with_retry_after(limited_server):
    """One running, one waiting (max_queue 1): the third is refused at once, not queued without bound."""

    def status():
        return requests.get(limited_server.url + "/status", timeout=5).json()["in_flight"]

    wait_for(lambda: status() == 0)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(post_cell, limited_server, 1)
        wait_for(lambda: status() == 1)
        waiting = pool.submit(post_cell, limited_server, 2)
        wait_for(lambda: status() == 2)
        refused = requests.post(limited_server.url + PIPELINE, json={"key": ["prompt"], "value": ["cell"]}, timeout=5)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["err_no"] == 6002
        assert running.result().status_code == 200 and waiting.result().status_code == 200


def test_a_request_whose_client_left_while_waiting_never_reaches_the_model(limited_server):
    def samples():
        return metric_samples(limited_server.url)

    wait_for(lambda: metric(samples(), "ernie_serving_queued") == 0 and metric(samples(), "ernie_serving_in_flight") == 1)
    before = samples()
    body = json.dumps({"prompt": "cell", "size": "32x32", "seed": 5}).encode()
    request = (
        b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(post_cell, limited_server, 4)  # holds the one inference thread for 300 ms
        wait_for(lambda: requests.get(limited_server.url + "/status", timeout=5).json()["in_flight"] == 1)
        quitter = socket.create_connection(("127.0.0.1", limited_server.port), timeout=5)
        quitter.sendall(request)
        wait_for(lambda: metric(samples(), "ernie_serving_queued") == 1)
        quitter.close()  # gone while waiting for the predictor
        assert running.result().status_code == 200
    wait_for(
        lambda: (
            metric(samples(), "ernie_serving_requests_total", route="openai", code="499")
            == metric(before, "ernie_serving_requests_total", route="openai", code="499") + 1
        )
    )
    after = samples()
    assert metric(after, "ernie_serving_images_total") == metric(before, "ernie_serving_images_total") + 1  # only the runner's


def test_log_lines_cannot_be_forged_and_carry_no_query_or_token(limited_server):
    """Was: ANSI escapes in unauthenticated URL paths went raw into the log, and a token in a query string
    was logged in clear."""
    requests.get(limited_server.url + "/%1b[31mred%0aFAKE LOG LINE?access_token=query-secret-123", timeout=5)
    requests.get(limited_server.url + "/status", headers={"Authorization": "Bearer header-secret-456"}, timeout=5)
    marker = f"/status-marker-{time.monotonic_ns()}"
    requests.get(limited_server.url + marker, timeout=5)  # the last line: everything before it is written
    log_path = Path(limited_server.log_path)
    wait_for(lambda: marker in log_path.read_text(errors="replace"))
    text = log_path.read_bytes()
    assert b"\x1b" not in text
    assert b"query-secret-123" not in text and b"header-secret-456" not in text and b"access_token" not in text
    line = next(line for line in text.decode().splitlines() if "red" in line and "404" in line)
    assert "\\x1b[31mred\\x0aFAKE LOG LINE" in line
    assert not any(line.startswith("FAKE LOG LINE") for line in text.decode().splitlines())


@pytest.mark.parametrize("route", [OPENAI, PIPELINE])
def test_limit_errors_are_json_with_a_paddle_code(limited_server, route):
    reply = requests.post(limited_server.url + route, data=b"x" * (17 * 1024), timeout=5)
    assert reply.status_code == 413
    payload = reply.json()
    assert (payload["err_no"] if route == PIPELINE else payload["error"]["code"]) == 5010
