"""HTTPS on the serving process, with a CA and a server certificate this test makes (`cryptography`)."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import astuple

import pytest
import requests
from serving_probe import OPENAI, metric, metric_samples
from support.tls import make_ca_and_server_cert
from support.waiting import wait_for

from dgx_assets.generation import launcher

MAX_CONNECTIONS = 20
HANDSHAKE_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def tls_server(quick_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    ca, cert, key = astuple(make_ca_and_server_cert(folder))
    limits = ["--max-connections", str(MAX_CONNECTIONS), "--handshake-timeout-s", str(HANDSHAKE_TIMEOUT_S)]
    server = launcher.start_server(quick_model, log_dir=folder, extra_args=["--tls-cert", cert, "--tls-key", key, *limits])
    try:
        deadline = time.monotonic() + 120
        while True:  # the launcher waits over http; this server speaks https only
            assert server.process.poll() is None, server.log_tail()
            assert time.monotonic() < deadline, server.log_tail()
            port = server.port_file.read_text().strip()
            if port:
                url = f"https://127.0.0.1:{port}"
                try:
                    if requests.get(url + "/status", verify=ca, timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
            time.sleep(0.2)
        server.port = int(port)
        yield url, ca, server
    finally:
        server.stop()


def test_https_serves_generation_with_a_certificate_the_client_verifies(tls_server):
    url, ca, _ = tls_server
    assert requests.get(url + "/status", verify=ca, timeout=5).json()["tls"] is True
    reply = requests.post(url + OPENAI, json={"prompt": "cell", "size": "32x32", "seed": 1}, verify=ca, timeout=30)
    assert reply.status_code == 200 and reply.json()["data"][0]["b64_json"]


def test_tls_1_2_is_the_minimum(tls_server):
    _, ca, server = tls_server
    modern = ssl.create_default_context(cafile=ca)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        modern.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(ca)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("ALL:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, pytest.raises(ssl.SSLError):
        old.wrap_socket(raw, server_hostname="127.0.0.1")


def test_unverified_and_plain_http_clients_get_nothing(tls_server):
    url, _, server = tls_server
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url + "/status", timeout=5)  # the system CAs do not know this one
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.port}/status", timeout=5)


def test_a_missing_certificate_stops_the_server_with_its_reason(quick_model, tmp_path):
    server = launcher.start_server(
        quick_model, log_dir=tmp_path, extra_args=["--tls-cert", str(tmp_path / "no.pem"), "--tls-key", str(tmp_path / "no.key")]
    )
    try:
        assert server.process.wait(60) == 2
        assert "cannot load TLS certificate" in server.log_tail()
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_the_projects_client_reaches_the_https_server_with_its_ca_bundle(tls_server, protocol):
    import base64

    from dgx_assets.generation.client import ErnieClient
    from dgx_assets.generation.client_settings import ClientSettings

    url, ca, _ = tls_server
    fast = {"max_retries": 0, "backoff_s": 0.01}
    reply = ErnieClient(ClientSettings(endpoints=(url,), protocol=protocol, ca_bundle=ca, **fast)).generate("cell", 32, 32, 1)
    assert reply.ok, reply.error
    assert base64.b64decode(reply.payload_b64)[:8] == b"\x89PNG\r\n\x1a\n"
    without_ca = ErnieClient(ClientSettings(endpoints=(url,), protocol=protocol, **fast)).generate("cell", 32, 32, 1)
    assert not without_ca.ok and without_ca.error_kind == "unavailable"


def _closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes `sock` (its first read returns nothing or is reset); fails past limit_s."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_stalled_handshakes_count_against_max_connections_and_are_closed_at_their_deadline(tls_server):
    """Was: a connection still in its TLS handshake escaped both max_connections and the header timeout:
    300 such connections were each held 60 s (asyncio's own handshake timeout)."""
    url, ca, server = tls_server
    before = metric_samples(url, verify=ca)
    stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        opened = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:  # one past the cap
            assert _closed_after(extra, HANDSHAKE_TIMEOUT_S / 2) < HANDSHAKE_TIMEOUT_S / 2  # refused at once
        for sock in stalled:  # no ClientHello ever: closed at the handshake deadline, not a minute later
            _closed_after(sock, HANDSHAKE_TIMEOUT_S + 5)
        assert HANDSHAKE_TIMEOUT_S * 0.9 < time.monotonic() - opened < HANDSHAKE_TIMEOUT_S + 3
    finally:
        for sock in stalled:
            sock.close()
    wait_for(lambda: requests.get(url + "/status", verify=ca, timeout=5).status_code == 200, what="served again")
    after = metric_samples(url, verify=ca)
    closed = "ernie_serving_connections_closed_total"
    for reason, count in (("handshake_timeout", MAX_CONNECTIONS), ("max_connections", 1)):
        assert metric(after, closed, reason=reason) - metric(before, closed, reason=reason) >= count, reason
