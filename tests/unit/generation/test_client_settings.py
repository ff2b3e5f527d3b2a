"""The generation client's settings: declared once (generation/client_settings.py), shown by the `ernie` resource as they
are, handed to the executors' client unchanged, and a wrong one is refused with its name."""

import re

import pytest
from pydantic import ValidationError

from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.generation.client_settings import ClientBehaviour, ClientSettings


def test_the_resource_shows_the_client_behaviour_as_declared():
    assert issubclass(ErnieServingResource, ClientBehaviour)
    fields = ErnieServingResource.model_fields
    for name, field in ClientBehaviour.model_fields.items():
        assert fields[name].description == field.description and fields[name].default == field.default


def test_the_client_gets_what_the_resource_was_given():
    resource = ErnieServingResource(
        endpoints="http://127.0.0.1:1", protocol="pipeline", max_retries=0, request_deadline_s=7.5, token="t0ken"
    )
    settings = resource.client_settings(("http://127.0.0.1:1/", "http://127.0.0.1:2"))
    assert type(settings) is ClientSettings
    assert settings.endpoints == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert (settings.protocol, settings.max_retries, settings.request_deadline_s) == ("pipeline", 0, 7.5)
    assert settings.token == "t0ken" and "t0ken" not in repr(settings)
    # The executors' client cache keys on the settings, across pickling into Spark's Python workers.
    assert hash(settings) == hash(resource.client_settings(("http://127.0.0.1:1", "http://127.0.0.1:2")))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"endpoints": ()}, "endpoints"),
        ({"protocol": "grpc"}, "protocol must be one of"),
        ({"concurrency": 0}, "concurrency"),
        ({"request_deadline_s": 0}, "request_deadline_s"),
        ({"status_deadline_s": -1}, "status_deadline_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"breaker_threshold": 0}, "breaker_threshold"),
    ],
)
def test_a_wrong_setting_is_named(settings, named):
    with pytest.raises(ValidationError, match=re.escape(named)):
        ClientSettings(**{"endpoints": ("http://127.0.0.1:1",), **settings})


def test_the_resource_refuses_a_wrong_setting_by_name():
    with pytest.raises(ValidationError, match="read_timeout_s"):
        ErnieServingResource(read_timeout_s=0)
