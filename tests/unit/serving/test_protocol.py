"""The serving wire protocol without a socket: what the executors' client sends parses into the request the
server means, a wrong field is refused with its error code, and what the server answers parses back in the
client, errors included (their code range decides whether the client retries elsewhere)."""

import pytest

from dgx_assets.generation import replies
from dgx_assets.serving import protocol
from dgx_assets.serving.config import Limits

LIMITS = Limits()
DEFAULT_SIZE = (512, 512)


def test_the_openai_body_the_client_sends_is_the_request_it_means():
    body = {"model": "ernie-image", "prompt": '裂纹 "cell"\n', "size": "64x32", "n": 1, "seed": 7, "response_format": "b64_json"}
    request = protocol.parse_openai(body | {"num_inference_steps": 5}, LIMITS, DEFAULT_SIZE)
    assert (request.prompt, request.width, request.height, request.seed, request.steps, request.count) == (
        '裂纹 "cell"\n', 64, 32, 7, 5, 1,
    )  # fmt: skip
    assert not request.cleaned
    assert protocol.parse_openai({"prompt": "x", "size": "auto"}, LIMITS, DEFAULT_SIZE).width == 512


def test_the_pipeline_body_the_client_sends_is_the_request_it_means():
    body = {"key": ["prompt", "width", "height", "seed", "steps"], "value": ["cell", "64", "32", "7", "5"]}
    request = protocol.parse_pipeline(body, LIMITS, DEFAULT_SIZE)
    assert (request.prompt, request.width, request.height, request.seed, request.steps) == ("cell", 64, 32, 7, 5)
    assert protocol.parse_pipeline({"key": ["prompt", "size"], "value": ["c", "48x16"]}, LIMITS, DEFAULT_SIZE).height == 16


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"size": "64x64"}, protocol.BAD_PROMPT),
        ({"prompt": 3}, protocol.BAD_PROMPT),
        ({"prompt": "  \n"}, protocol.BAD_PROMPT),
        ({"prompt": "x", "size": "64"}, protocol.BAD_SIZE),
        ({"prompt": "x", "size": "8x8"}, protocol.BAD_SIZE),
        ({"prompt": "x", "size": "4096x4096"}, protocol.BAD_SIZE),
        ({"prompt": "x", "n": 0}, protocol.BAD_COUNT),
        ({"prompt": "x", "n": True}, protocol.BAD_COUNT),
        ({"prompt": "x", "n": "1e9"}, protocol.BAD_COUNT),
        ({"prompt": "x", "seed": -1}, protocol.BAD_SEED),
        ({"prompt": "x", "seed": 2**32}, protocol.BAD_SEED),
        ({"prompt": "x", "num_inference_steps": 0}, protocol.BAD_STEPS),
        ({"prompt": "x", "num_inference_steps": 2.5}, protocol.BAD_STEPS),
        ({"prompt": "x", "response_format": "url"}, protocol.BAD_FORMAT),
    ],
)
def test_a_wrong_openai_field_is_refused_with_its_code(body, code):
    with pytest.raises(protocol.ApiError) as refused:
        protocol.parse_openai(body, LIMITS, DEFAULT_SIZE)
    assert (refused.value.http_status, refused.value.code) == (400, code)


@pytest.mark.parametrize(
    "body",
    [
        {"key": ["prompt"], "value": []},
        {"key": "prompt", "value": "x"},
        {"value": ["x"]},
    ],
)
def test_a_malformed_pipeline_body_is_refused(body):
    with pytest.raises(protocol.ApiError) as refused:
        protocol.parse_pipeline(body, LIMITS, DEFAULT_SIZE)
    assert refused.value.code == protocol.BAD_INPUT


def test_a_replaced_character_is_reported_as_cleaned():
    assert protocol.parse_openai({"prompt": "cell\x00\ud800ok"}, LIMITS, DEFAULT_SIZE).cleaned


def test_the_replies_parse_back_in_the_client():
    openai = protocol.openai_reply(["aW1n"], "used", True, 3, 7, False, created=1)
    assert replies.openai_image(openai, "asked") == ("aW1n", True, "used")
    pipeline = protocol.pipeline_reply(["aW1n"], "used", False, 3, 7, 64, 32, False, logid=9)
    assert replies.pipeline_image(pipeline, "asked") == ("aW1n", False, "used")


def test_an_input_error_is_final_and_a_timeout_is_retried_elsewhere():
    refused = protocol.pipeline_error(protocol.bad(protocol.BAD_SIZE, "size 8x8 is outside 16..2048 per side"))
    with pytest.raises(replies.Rejected, match="err_no 5002: size 8x8"):
        replies.pipeline_image(refused, "x")
    busy = protocol.pipeline_error(protocol.ApiError(503, protocol.TIMEOUT, "no predictor free"))
    with pytest.raises(replies.Retryable, match="err_no 6000"):
        replies.pipeline_image(busy, "x")
    assert protocol.ApiError(503, protocol.QUEUE_FULL, "full").headers == {"Retry-After": "1"}
    error = protocol.openai_error(protocol.ApiError(503, protocol.MODEL_LOADING, "loading"))
    assert error == {"error": {"message": "loading", "type": "server_error", "code": protocol.MODEL_LOADING}}
    assert replies.error_message(error) == "loading"
