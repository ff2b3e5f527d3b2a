"""`dgx-assets docs-server`, the read-only http server `make dev` starts for the report, GE's data docs and the
review queues, as a real process on 127.0.0.1: it serves those folders, refuses to write or to step outside
them, stops on SIGINT."""

import functools
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from dagster_dev import free_port
from support.docs_server import docs_server
from support.review_queue import CLASSES, jpeg, png
from support.waiting import wait_for

from dgx_assets.lake.store import Lake
from dgx_assets.production import review
from dgx_assets.quality.expectations import data_docs_site


@pytest.fixture
def server(tmp_path, _state_dir):
    lake = tmp_path / "lake"
    (lake / "quality_report").mkdir(parents=True)
    (lake / "quality_report" / "report.html").write_text("<html><body>Verdict: PASS 单晶硅</body></html>", encoding="utf-8")
    (lake / "quality_report" / ".staging-x").write_text("half written")
    (lake / "secret.txt").write_text("not served")
    # Links out of the folder, to a file and to the process's environment: never followed.
    (lake / "quality_report" / "outside.txt").symlink_to(lake / "secret.txt")
    (lake / "quality_report" / "environ").symlink_to("/proc/self/environ")
    (lake / "quality_report" / "linked").symlink_to(lake)
    site = data_docs_site()  # under this test's DGX_STATE_DIR
    (site / "validations").mkdir(parents=True)
    (site / "index.html").write_text("<html>raw_images.valid_image_share[b1]</html>")
    (site / "validations" / "b1.html").write_text("<html>one validation</html>")
    (site / "bootstrap.min.css").write_text("body{}")
    with docs_server(free_port(), {"DGX_LAKE_ROOT": str(lake)}, tmp_path / "docs-server.log") as running:
        yield running


def test_serves_the_report_and_the_data_docs_over_http(server):
    base, _ = server
    report = requests.get(f"{base}/quality_report/report.html", timeout=5)
    assert report.status_code == 200 and report.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "Verdict: PASS 单晶硅" in report.text
    first = requests.get(base, timeout=5)  # the address alone opens the report
    assert first.url == f"{base}/quality_report/report.html" and "Verdict" in first.text
    assert "Verdict" in requests.get(f"{base}/quality_report/", timeout=5).text
    assert "valid_image_share[b1]" in requests.get(f"{base}/data-docs/", timeout=5).text
    assert requests.get(f"{base}/data-docs/validations/b1.html", timeout=5).text == "<html>one validation</html>"
    css = requests.get(f"{base}/data-docs/bootstrap.min.css", timeout=5)
    assert css.headers["Content-Type"] == "text/css; charset=utf-8"
    head = requests.head(f"{base}/quality_report/report.html", timeout=5)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(report.content) and not head.content


def test_is_read_only_and_serves_nothing_outside_its_two_folders(server):
    base, process = server
    for method in ("POST", "PUT", "DELETE"):
        refused = requests.request(method, f"{base}/quality_report/report.html", data=b"x", timeout=5)
        assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"
    for path in (
        "/quality_report/../secret.txt",
        "/quality_report/%2e%2e/secret.txt",
        "/quality_report/..%2fsecret.txt",
        "/quality_report/a%2f..%2f..%2fsecret.txt",
        "/quality_report/.staging-x",
        "/secret.txt",
        "/data-docs/validations/",  # a folder without a page: no listing
        "/data-docs/missing.html",
    ):
        response = requests.get(base + path, timeout=5, allow_redirects=False)
        assert response.status_code == 404, path
        assert "not served" not in response.text and "half written" not in response.text
    process.send_signal(signal.SIGINT)  # as Ctrl-C in `make dev`
    assert process.wait(timeout=20) == 0


def _raw_get(base: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET with the path sent exactly as given (no client-side normalising or quoting)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=5)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_links_and_hostile_paths_get_a_clean_refusal_and_nothing_else(server):
    base, process = server
    for path in ("/quality_report/outside.txt", "/quality_report/environ", "/quality_report/linked/secret.txt"):
        status, _, body = _raw_get(base, path)
        assert status == 404 and b"not served" not in body and b"DGX_" not in body, path
    # A CRLF in the path never reaches a status line or a header: no cookie is set, no body is injected.
    status, headers, body = _raw_get(base, "/quality_report/x%0d%0aSet-Cookie:%20a=b%0d%0a%0d%0a<script>")
    assert status == 400 and "set-cookie" not in headers and b"<script>" not in body
    for path in ("/quality_report/%c0%ae%c0%ae/secret.txt", "/quality_report/a%00b", "/quality_report/" + "n" * 300):
        status, _, body = _raw_get(base, path)
        assert status in (400, 404) and body, path  # a reply with a body, not an empty one
    assert requests.get(f"{base}/quality_report/report.html", timeout=5).status_code == 200  # still serving
    assert process.poll() is None


def test_serves_a_review_queue_read_only_and_nothing_beside_it(server, tmp_path):
    import hashlib

    base, process = server
    lake, batch = Lake(str(tmp_path / "lake")), "lot#1 é"
    images = {hashlib.sha256(data).hexdigest(): review.RawImage(data, ext) for data, ext in ((png(1), "png"), (jpeg(2), "jpg"))}
    queued = [{"sha256": sha, "path": f"file:/landing/{sha}", "defect_probability": 0.5} for sha in images]
    saliency = {sha: png(3) for sha in images}
    options = {"docs_url": base, "model_version": "7", "threshold": 0.4, "saliency": saliency, "images": images}
    folder = Path(lake.fs_path(review.write_queue(lake, batch, queued, CLASSES, **options)))
    for task in requests.get(review.queue_url(base, batch, review.TASKS_FILE), timeout=5).json():
        image = requests.get(task["data"]["image"], timeout=5)
        expected = images[task["data"]["sha256"]]
        kind = {"png": "image/png", "jpg": "image/jpeg"}[expected.extension]
        assert image.status_code == 200 and image.headers["Content-Type"] == kind and image.content == expected.content
        assert requests.get(task["data"]["saliency"], timeout=5).headers["Content-Type"] == "image/png"
    assert requests.post(task["data"]["image"], timeout=5).status_code == 405
    # Links in the queue, to a file beside the lake or to the lake itself as a batch's folder, are never followed.
    (folder / "images" / "linked.png").symlink_to(tmp_path / "lake" / "secret.txt")
    (folder.parent / "batch=linked").symlink_to(tmp_path / "lake")
    queue = urlsplit(review.queue_url(base, batch)).path
    for path in (
        f"{queue}/images/linked.png",
        "/review_queue/batch%3Dlinked/secret.txt",
        "/review_queue/../secret.txt",
        "/review_queue/%2e%2e/secret.txt",
        f"{queue}/../../secret.txt",
        f"{queue}/..%2f..%2fsecret.txt",
        f"{queue}/images/%2e%2e/%2e%2e/%2e%2e/secret.txt",
    ):
        status, _, body = _raw_get(base, path)
        assert status == 404 and b"not served" not in body, path
    assert process.poll() is None


def test_a_large_file_is_streamed_to_slow_readers_with_flat_memory(server, tmp_path):
    import socket
    import time

    base, process = server
    big = tmp_path / "lake" / "quality_report" / "big.bin"
    big.write_bytes(os.urandom(30 * 1024 * 1024))

    def rss_mb() -> float:
        status = Path(f"/proc/{process.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024

    before = rss_mb()
    port = int(base.rsplit(":", 1)[1])
    readers = []
    for _ in range(10):  # each asks for the 30 MB file and reads only its first bytes
        reader = socket.create_connection(("127.0.0.1", port), timeout=5)
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(b"GET /quality_report/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reader.recv(1024).startswith(b"HTTP/1.1 200")
        readers.append(reader)
    time.sleep(2)
    grown = rss_mb() - before
    for reader in readers:
        reader.close()
    assert grown < 100, f"the server's memory grew {grown:.0f} MB for 10 slow readers of a 30 MB file"
    assert requests.get(f"{base}/quality_report/report.html", timeout=5).status_code == 200


def test_stops_on_sigint_and_sigterm_even_when_started_with_sigint_ignored(tmp_path, _state_dir):
    import subprocess
    import sys
    import time
    from pathlib import Path

    # A shell starts background jobs (`make dev &`, `nohup ... &`) with SIGINT ignored, and Python then never
    # raises KeyboardInterrupt: the server ran on after Ctrl-C's signal, and the browser test hung on it.
    for stop in (signal.SIGINT, signal.SIGTERM):
        port = free_port()
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dgx-assets"), "docs-server", "--port", str(port)],
            env={**os.environ, "DGX_LAKE_ROOT": str(tmp_path / "lake")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        try:
            wait_for(functools.partial(_answers, port), timeout_s=60, interval_s=0.2, what="the docs server")
            started = time.monotonic()
            process.send_signal(stop)
            assert process.wait(timeout=20) == 0 and time.monotonic() - started < 10, stop
        finally:
            if process.poll() is None:
                process.kill()


def _answers(port: int) -> bool:
    try:
        requests.head(f"http://127.0.0.1:{port}/", timeout=1)
    except requests.ConnectionError:
        return False
    return True
