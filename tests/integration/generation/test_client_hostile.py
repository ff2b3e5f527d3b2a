"""The client against an endpoint of the tests' own that misbehaves on purpose: replies of the wrong shape,
replies dripped one byte at a time, and https with a certificate the test makes."""

from __future__ import annotations

import base64
import ssl
import time

import pytest
from rogue import RogueServer, png
from support.generation import build_generated_frame
from support.tls import make_ca_and_server_cert

from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.generation import generate
from dgx_assets.generation.client import ErnieClient
from dgx_assets.generation.client_settings import ClientSettings

FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05, "breaker_cooldown_s": 30.0, "status_ttl_s": 60.0}
IMAGE = base64.b64encode(png(32, 32)).decode()

BAD_OPENAI = {
    "b64_json as a number": {"data": [{"b64_json": 12345}]},
    "revised_prompt as a number": {"data": [{"b64_json": IMAGE, "revised_prompt": 7}]},
    "data as a string": {"data": "image"},
    "no data": {"created": 1},
    "empty data": {"data": []},
    "a list, not an object": [{"b64_json": IMAGE}],
    "truncated as a string": {"data": [{"b64_json": IMAGE}], "truncated": "no"},
}
BAD_PIPELINE = {
    "err_no as a string": {"err_no": "0", "err_msg": "", "key": ["image"], "value": [IMAGE]},
    "err_no as a boolean": {"err_no": True, "key": ["image"], "value": [IMAGE]},
    "key and value not lists": {"err_no": 0, "key": "image", "value": IMAGE},
    "a value not a string": {"err_no": 0, "key": ["image"], "value": [5]},
    "lists of two lengths": {"err_no": 0, "key": ["image", "truncated"], "value": [IMAGE]},
    "err_msg as a list": {"err_no": 6001, "err_msg": ["x"], "key": [], "value": []},
    "no image key": {"err_no": 0, "key": ["picture"], "value": [IMAGE]},
}


@pytest.fixture
def rogue():
    server = RogueServer()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "protocol,shape", [("openai", name) for name in BAD_OPENAI] + [("pipeline", name) for name in BAD_PIPELINE]
)
def test_a_reply_of_the_wrong_shape_is_a_bad_reply_retried_then_recorded(rogue, protocol, shape):
    bad = ("json", (BAD_OPENAI if protocol == "openai" else BAD_PIPELINE)[shape])
    client = ErnieClient(ClientSettings(endpoints=(rogue.url,), protocol=protocol, max_retries=1, **FAST))
    rogue.script = [bad]  # once: the retry gets a proper image
    healed = client.generate("cell", 32, 32, seed=1)
    assert healed.ok and healed.tries == 2, healed.error
    rogue.script = [bad, bad]  # every try: the reply says why
    reply = client.generate("cell", 32, 32, seed=1)
    assert (reply.ok, reply.error_kind, reply.tries) == (False, "bad_reply", 2)
    assert "bad_reply: " in reply.error


def test_a_reply_that_is_not_json_is_a_bad_reply(rogue):
    rogue.always = ("raw", 200, b"<html>proxy error</html>")
    reply = ErnieClient(ClientSettings(endpoints=(rogue.url,), max_retries=0, **FAST)).generate("cell", 32, 32, seed=1)
    assert reply.error_kind == "bad_reply" and "not a JSON object" in reply.error


def test_an_answer_that_closes_the_connection_is_read_whole(rogue):
    """A 401 with `Connection: close`: http.client closes the socket while the body is still to be read."""
    rogue.always = ("raw", 401, b'{"error": {"message": "missing or wrong bearer token"}}', "close")
    reply = ErnieClient(ClientSettings(endpoints=(rogue.url,), **FAST)).generate("cell", 32, 32, seed=1)
    assert (reply.error_kind, reply.tries) == ("rejected", 1)
    assert reply.error == "HTTP 401: 'missing or wrong bearer token'"


def test_bad_replies_end_in_rows_that_say_so_and_no_row_is_lost(rogue, spark, tmp_path):
    import pandas as pd

    rogue.always = ("json", BAD_OPENAI["b64_json as a number"])
    settings = ClientSettings(endpoints=(rogue.url,), max_retries=1, concurrency=2, breaker_threshold=100, **FAST)
    job = generate.GenerationJob(
        settings,
        lake_root=tmp_path.as_uri(),
        png_uri=(tmp_path / "png").as_uri(),
        max_attempts=2,
        default_width=32,
        default_height=32,
    )
    prompts = spark.createDataFrame(
        pd.DataFrame(
            [
                {"id": f"p{i}", "prompt": f"cell {i}", "width": "32", "height": "32", "seed": str(i), "label": None}
                for i in range(5)
            ]
        ).astype(str)
    )
    rows = [row.asDict() for row in build_generated_frame(prompts, job).collect()]  # before: TypeError
    assert sorted(row["id"] for row in rows) == [f"p{i}" for i in range(5)]
    assert {row["status"] for row in rows} == {"bad_reply"}
    assert all("b64_json is int 12345, not a string" in row["error"] for row in rows)
    assert all(row["attempts"] == 2 and row["http_tries"] == 4 for row in rows)  # regenerated like other failures


def test_a_dripping_endpoint_costs_one_deadline_per_try(rogue):
    rogue.always = ("drip", 0.05)  # a whole reply takes ~20 s this way; each byte comes well within read_timeout_s
    settings = ClientSettings(endpoints=(rogue.url,), read_timeout_s=5.0, request_deadline_s=0.5, max_retries=1, **FAST)
    started = time.monotonic()
    reply = ErnieClient(settings).generate("cell", 32, 32, seed=1)
    elapsed = time.monotonic() - started
    assert reply.error_kind == "unavailable" and "0.5s deadline" in reply.error and reply.tries == 2
    assert elapsed < 2.5, elapsed  # two tries of 0.5 s and a short backoff, not the drip's 20 s


def test_a_dripping_status_probe_costs_one_status_deadline(rogue):
    rogue.drip_status = 0.1  # the /status reply alone takes ~10 s this way
    settings = ClientSettings(endpoints=(rogue.url,), connect_timeout_s=3.0, status_deadline_s=0.3, max_retries=0, **FAST)
    client = ErnieClient(settings)
    started = time.monotonic()
    reply = client.generate("cell", 32, 32, seed=1)
    assert time.monotonic() - started < 1.5
    assert reply.error_kind == "unavailable" and "no endpoint available" in reply.error
    assert "0.3s deadline" in client.endpoints[0].last_error


# --- TLS ------------------------------------------------------------------------------------------------------


def https_server(paths, maximum_version=None) -> RogueServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths.server, paths.server_key)
    if maximum_version is not None:
        context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        context.maximum_version = maximum_version
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 refuses TLS 1.1 above security level 0
    return RogueServer(ssl_context=context)


def test_https_endpoints_are_verified_against_the_ca_bundle_and_need_tls_1_2(tmp_path):
    paths = make_ca_and_server_cert(tmp_path)
    server = https_server(paths)
    try:
        resource = ErnieServingResource(endpoints=server.url, ca_bundle=paths.ca, max_retries=0, backoff_s=0.01)
        trusted = ErnieClient(resource.client_settings((server.url,)))
        reply = trusted.generate("cell", 32, 32, seed=1)
        assert reply.ok, reply.error
        connection = trusted._pool.connection_from_url(server.url).pool.queue[-1]
        assert connection.sock.version() in ("TLSv1.2", "TLSv1.3")

        unknown = ErnieClient(ClientSettings(endpoints=(server.url,), max_retries=0, **FAST)).generate("cell", 32, 32, seed=1)
        assert unknown.error_kind == "unavailable" and "CERTIFICATE_VERIFY_FAILED" in unknown.error

        unverified = ErnieServingResource(endpoints=server.url, verify_tls=False).client_settings((server.url,))
        with pytest.warns(Warning, match="Unverified HTTPS request"):
            assert ErnieClient(unverified).generate("cell", 32, 32, seed=1).ok
    finally:
        server.stop()

    try:
        old = https_server(paths, maximum_version=ssl.TLSVersion.TLSv1_1)
    except ssl.SSLError as error:  # an OpenSSL built without TLS 1.1 cannot even offer it
        pytest.skip(f"this OpenSSL cannot serve TLS 1.1: {error}")
    try:
        refused = ErnieClient(
            ClientSettings(endpoints=(old.url,), ca_bundle=paths.ca, verify_tls=False, max_retries=0, **FAST)
        ).generate("cell", 32, 32, seed=1)
        assert refused.error_kind == "unavailable" and "SSL" in refused.error
    finally:
        old.stop()
