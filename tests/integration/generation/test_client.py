"""The executor-side client against real serving processes: both protocols, round-robin, retries,
circuit breakers, endpoints dying mid-run, and a clear answer when nothing is up."""

from __future__ import annotations

import base64
import io
import itertools
import time

import pytest
from PIL import Image
from support.waiting import wait_for

from dgx_assets.generation.client import ErnieClient, get_client
from dgx_assets.generation.client_settings import ClientSettings, parse_endpoints

FAST = dict(backoff_s=0.05, backoff_max_s=0.2, breaker_cooldown_s=30.0, status_ttl_s=60.0)


def image_of(reply) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(reply.payload_b64)))
    image.load()
    return image


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_both_protocols_return_images_of_the_requested_size(fleet, protocol):
    client = ErnieClient(ClientSettings(endpoints=(fleet["a"].url,), protocol=protocol, **FAST))
    reply = client.generate('a "defective" mono cell \\ 有缺陷', 80, 48, seed=5)
    assert reply.ok, reply.error
    assert image_of(reply).size == (80, 48)
    assert reply.used_prompt == 'a "defective" mono cell \\ 有缺陷'
    assert reply.truncated is False and reply.endpoint == fleet["a"].url and reply.tries == 1


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_over_long_prompt_comes_back_flagged(fleet, protocol):
    client = ErnieClient(ClientSettings(endpoints=(fleet["a"].url,), protocol=protocol, **FAST))
    prompt = " ".join(["defective"] * 400)
    reply = client.generate(prompt, 32, 32, seed=1)
    assert reply.ok and reply.truncated is True
    assert prompt.startswith(reply.used_prompt) and len(reply.used_prompt) < len(prompt)


def test_requests_spread_round_robin_over_endpoints(fleet):
    client = ErnieClient(ClientSettings(endpoints=(fleet["a"].url, fleet["b"].url), concurrency=4, **FAST))
    replies = client.generate_many([("cell", 32, 32, seed) for seed in range(8)])
    assert all(reply.ok for reply in replies)
    used = [reply.endpoint for reply in replies]
    assert used.count(fleet["a"].url) == 4 and used.count(fleet["b"].url) == 4


def test_bad_requests_are_not_retried(fleet):
    for protocol in ("openai", "pipeline"):
        client = ErnieClient(ClientSettings(endpoints=(fleet["a"].url,), protocol=protocol, **FAST))
        reply = client.generate("cell", 99999, 32, seed=1)
        assert reply.error_kind == "rejected" and reply.tries == 1
        assert "outside" in reply.error


def test_503_is_retried_elsewhere_and_the_breaker_opens(fleet):
    settings = ClientSettings(endpoints=(fleet["unavailable"].url, fleet["a"].url), breaker_threshold=2, **FAST)
    client = ErnieClient(settings)
    replies = [client.generate("cell", 32, 32, seed) for seed in range(6)]
    assert all(reply.ok for reply in replies)
    assert {reply.endpoint for reply in replies} == {fleet["a"].url}
    sick = client.endpoints[0]
    assert sick.breaker_state(time.monotonic(), settings.breaker_cooldown_s) == "open"
    assert sick.errors == 2  # opened after two 503s, then skipped without being called
    assert "HTTP 503" in sick.last_error
    assert any(reply.tries == 2 for reply in replies)


def test_timeouts_are_retried_then_the_breaker_opens(fleet):
    settings = ClientSettings(endpoints=(fleet["slow"].url, fleet["b"].url), read_timeout_s=0.5, breaker_threshold=2, **FAST)
    client = ErnieClient(settings)
    replies = [client.generate("cell", 32, 32, seed) for seed in range(5)]
    assert all(reply.ok for reply in replies)
    slow = client.endpoints[0]
    assert slow.breaker_state(time.monotonic(), settings.breaker_cooldown_s) == "open"
    assert "ReadTimeoutError" in slow.last_error


def test_breaker_probes_again_after_the_cooldown(fleet, dead_url):
    cooldown = 1.0  # long enough that the call right after the breaker opened is surely inside it
    settings = ClientSettings(
        endpoints=(dead_url,), breaker_threshold=1, max_retries=0, backoff_s=0.01, breaker_cooldown_s=cooldown, status_ttl_s=60.0
    )
    client = ErnieClient(settings)
    assert client.generate("cell", 32, 32, 1).error_kind == "unavailable"
    endpoint = client.endpoints[0]
    assert endpoint.breaker_state(time.monotonic(), cooldown) == "open"
    # The server "comes back" at the same address: after the cool-down one probe goes through.
    endpoint.url = fleet["a"].url
    assert client.generate("cell", 32, 32, 1).error_kind == "unavailable"  # still cooling down: not called
    wait_for(
        lambda: endpoint.breaker_state(time.monotonic(), cooldown) == "half-open",
        timeout_s=5 * cooldown,
        what="the breaker's cool-down",
    )
    reply = client.generate("cell", 32, 32, 1)
    assert reply.ok and endpoint.breaker_state(time.monotonic(), cooldown) == "closed"


def test_endpoints_that_are_not_ready_are_skipped(fleet, quick_model, tmp_path, start_fleet):
    broken_model = tmp_path / "broken"
    broken_model.mkdir()
    from dgx_assets.generation import launcher

    for name in launcher.MODEL_FILES:
        (broken_model / name).write_text("{}")
    broken = launcher.start_server(broken_model, log_dir=tmp_path)
    try:
        with pytest.raises(launcher.LaunchError):
            launcher.wait_ready([broken], timeout_s=60)
        client = ErnieClient(ClientSettings(endpoints=(broken.url, fleet["a"].url), **FAST))
        replies = [client.generate("cell", 32, 32, seed) for seed in range(4)]
        assert all(reply.ok and reply.endpoint == fleet["a"].url for reply in replies)
        assert client.endpoints[0].errors == 0  # skipped on its /status, never sent work
        assert "status failed" in client.describe_endpoints()
    finally:
        broken.stop()


def test_a_server_killed_mid_run_hands_its_work_to_the_other(start_fleet):
    pair = start_fleet(first=[], second=[])
    client = ErnieClient(ClientSettings(endpoints=(pair["first"].url, pair["second"].url), concurrency=3, **FAST))
    started = itertools.count()
    generate_one = client.generate

    def generate_killing_the_first_server_at_the_tenth(*request):
        if next(started) == 10:
            pair["first"].kill()  # SIGKILL while other requests are in flight on the pooled connections
        return generate_one(*request)

    client.generate = generate_killing_the_first_server_at_the_tenth
    replies = client.generate_many([("defective cell", 32, 32, seed) for seed in range(30)])
    assert pair["first"].process.poll() is not None
    assert all(reply.ok for reply in replies), [r.error for r in replies if not r.ok]
    assert {reply.endpoint for reply in replies[:9]} == {pair["first"].url, pair["second"].url}
    assert {reply.endpoint for reply in replies[10:]} == {pair["second"].url}
    assert client.endpoints[0].errors >= 1  # the dead server was tried, failed, and its work moved


def test_all_endpoints_down_gives_a_clear_error(dead_url):
    settings = ClientSettings(
        endpoints=(dead_url, dead_url.replace("http://127.0.0.1", "http://localhost")), max_retries=2, **FAST
    )
    client = ErnieClient(settings)
    started = time.monotonic()
    reply = client.generate("cell", 32, 32, 1)
    assert reply.error_kind == "unavailable"
    assert "gave up after 3 tries" in reply.error
    assert "no endpoint available" in reply.error or "unreachable" in reply.error
    assert time.monotonic() - started < 10


def test_token_is_sent(start_fleet, monkeypatch):
    monkeypatch.setenv("CLIENT_TEST_TOKEN", "s3cret")
    secured = start_fleet(secure=["--token-env", "CLIENT_TEST_TOKEN"])
    without = ErnieClient(ClientSettings(endpoints=(secured["secure"].url,), **FAST)).generate("cell", 32, 32, 1)
    assert without.error_kind == "rejected" and "401" in without.error
    with_token = ErnieClient(ClientSettings(endpoints=(secured["secure"].url,), token="s3cret", **FAST))
    assert with_token.generate("cell", 32, 32, 1).ok
    assert "s3cret" not in repr(with_token.settings)  # the token stays out of logs and reprs


def test_one_client_per_worker_reuses_connections(fleet):
    settings = ClientSettings(endpoints=(fleet["a"].url,), **FAST)
    client = get_client(settings)
    assert get_client(ClientSettings(endpoints=(fleet["a"].url,), **FAST)) is client
    for seed in range(3):
        assert client.generate("cell", 32, 32, seed).ok
    pool = client._pool.connection_from_url(fleet["a"].url)
    assert pool.num_connections == 1  # three requests (and a /status) over one kept-alive connection


def test_endpoint_list_parsing():
    assert parse_endpoints(" http://a:1/, https://b:2 ,,") == ("http://a:1", "https://b:2")
    with pytest.raises(ValueError, match="http"):
        parse_endpoints("a:1")
