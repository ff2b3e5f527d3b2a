"""The operator config file and the server's failure modes at start-up."""

from __future__ import annotations

import pytest

from dgx_assets import settings
from dgx_assets.generation import launcher
from dgx_assets.serving.config import ConfigError, build_config, load_config_file


def test_deploy_config_file_maps_to_settings():
    config = build_config(str(settings.repo_root() / "deploy" / "serving" / "config.yml"))
    assert config.port == 9998 and config.host == "127.0.0.1"
    assert config.device == "gpu" and config.gpu_ids == (0,) and config.ir_optim is True
    assert config.max_body_bytes == 16 * 1024
    assert (config.max_connections, config.max_queue) == (2048, 32)
    assert (config.header_timeout_s, config.body_timeout_s, config.keep_alive_s) == (10, 10, 30)
    assert config.tls_cert is None and config.engine == "dgx_assets.serving.engine:load_engine"
    assert config.token_env == "ERNIE_SERVING_TOKEN"
    assert config.request_timeout_s == 60.0
    assert config.limits.max_prompt_tokens == 256


def test_flags_override_the_file():
    config = build_config(str(settings.repo_root() / "deploy" / "serving" / "config.yml"), port=0, device="cpu", ir_optim=False)
    assert (config.port, config.device, config.ir_optim) == (0, "cpu", False)


def test_paddle_serving_keys_are_accepted_and_typos_are_not(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(
        "http_port: 18080\nrpc_port: 9999\nworker_num: 4\ndag: {is_thread_op: false}\n"
        "op:\n  det:\n    concurrency: 2\n    local_service_conf:\n      devices: '2,3'\n"
        "      device_type: 0\n      fetch_list: [x]\nmax_body_size: 1.5MB\n"
    )
    settings_ = load_config_file(path)
    assert settings_["port"] == 18080 and settings_["service_name"] == "det" and settings_["concurrency"] == 2
    assert settings_["gpu_ids"] == (2, 3) and settings_["device"] == "cpu"
    assert settings_["max_body_bytes"] == int(1.5 * 1024 * 1024)
    path.write_text("http_prot: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'http_prot'"):
        load_config_file(path)


@pytest.mark.parametrize(
    "text, words",
    [
        ("op:\n  a: {local_service_conf: {device_type: 2}}\n", "device_type must be 0"),
        ("op:\n  a: {}\n  b: {}\n", "exactly one service"),
        ("limits: {max_sid: 4}\n", "unknown keys"),
        ("max_body_size: lots\n", "max_body_size"),
        ("op:\n  a: {local_service_conf: {ir_optim: maybe}}\n", "true or false"),
        ("- a\n- b\n", "mapping"),
        ("tls_cert: /x.crt\n", "both a certificate"),
        ("header_timeout_s: 0\n", "more than 0"),
        ("max_connections: 0\n", "max_connections"),
        ("engine: not a spec\n", "module:callable"),
        ("engine_options: [novalue]\n", "NAME=VALUE"),
    ],
)
def test_bad_config_files_get_clear_errors(tmp_path, text, words):
    path = tmp_path / "config.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        build_config(str(path))


def test_missing_model_files_are_named_before_anything_starts(tmp_path):
    with pytest.raises(launcher.LaunchError, match="build-generator"):
        launcher.start_local_servers(2, tmp_path)
