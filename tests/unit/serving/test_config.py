"""The operator config file and the server's failure modes at start-up."""

from __future__ import annotations

import time

import pytest
from support.serving_config import load_config_file

from dgx_assets import settings
from dgx_assets.generation import launcher
from dgx_assets.serving.config import ConfigError, build_config


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
        ("op:\n  a: {local_service_conf: {device_type: 2}}\n", r"op\.a\.local_service_conf\.device_type: must be 0 \(cpu\)"),
        ("op:\n  a: {}\n  b: {}\n", "exactly one service"),
        ("limits: {max_sid: 4}\n", r"limits\.max_sid: Extra inputs are not permitted"),
        ("max_body_size: lots\n", "max_body_size"),
        ("op:\n  a: {local_service_conf: {ir_optim: maybe}}\n", r"ir_optim: Input should be a valid boolean \(got 'maybe'\)"),
        ("- a\n- b\n", "mapping"),
        ("tls_cert: /x.crt\n", "both a certificate"),
        ("header_timeout_s: 0\n", r"header_timeout_s: Input should be greater than 0"),
        ("max_connections: 0\n", "max_connections"),
        ("engine: not a spec\n", r"engine: String should match pattern"),
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


def alias_bomb(width: int = 16, depth: int = 6) -> str:
    """11 lines of YAML whose last alias expands to width**depth strings (16.7 million here)."""
    lines = ["op:", "  ernie_image:", "    local_service_conf:", "      devices:"]
    lines.append("        - &a [" + ",".join(['"lol"'] * width) + "]")
    for below, name in zip("abcde", "bcdef"):
        lines.append(f"        - &{name} [" + ",".join([f"*{below}"] * width) + "]")
    lines.append("        - *f")
    return "\n".join(lines[: 5 + depth - 1] + [lines[-1].replace("*f", f"*{'abcdef'[depth - 1]}")]) + "\n"


def test_an_alias_bomb_is_refused_at_its_first_anchor_in_a_short_message(tmp_path):
    """Was: 11 lines took 22.9 s and 3.1 GB, and the error message held the whole 247 MB expansion."""
    path = tmp_path / "config.yml"
    path.write_text(alias_bomb())
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"line 5: YAML anchors and aliases are not accepted") as refused:
        build_config(str(path))
    assert time.monotonic() - started < 1 and len(str(refused.value)) < 300
    path.write_text("host: &h 127.0.0.1\n")  # a lone anchor, harmless, is refused too: the rule is simple
    with pytest.raises(ConfigError, match="anchors and aliases"):
        build_config(str(path))


@pytest.mark.parametrize(
    "text, words",
    [
        ("op:\n  ernie_image: {concurrency: .inf}\n", r"ernie_image\.concurrency: Input should be a valid integer \(got inf\)"),
        ("header_timeout_s: .inf\n", r"header_timeout_s: Input should be a finite number"),
        ("keep_alive_s: 1.0e+9\n", r"keep_alive_s: Input should be less than or equal to 3600"),
        ("op:\n  ernie_image: [1, 2]\n", r"op\.ernie_image must be a mapping, got a list of 2 items"),
        ("limits: [1, 2]\n", r"limits: Input should be a valid dictionary or instance of Limits"),
        ("limits: {max_images: -1}\n", r"limits\.max_images: Input should be greater than or equal to 1 \(got -1\)"),
        ("max_queue: -5\n", r"max_queue: Input should be greater than or equal to 0"),
        ("http_port: true\n", r"http_port: Input should be a valid integer \(got True\)"),
        ("http_port: 70000\n", r"http_port: Input should be less than or equal to 65535"),
        ("op:\n  ernie_image: {concurrency: 3.99}\n", r"ernie_image\.concurrency: Input should be a valid integer \(got 3\.99\)"),
        ("max_connections: '12'\n", r"max_connections: Input should be a valid integer \(got '12'\)"),
        ("http_port: 9998\nhost: 0.0.0.0\nhttp_port: 80\n", r"line 3: duplicate key 'http_port'"),
        ("op:\n  a:\n    concurrency: 1\n    concurrency: 2\n", r"line 4: duplicate key 'concurrency'"),
        ("max_body_size: 99999999999999999999TB\n", r"max_body_size: must be a number of bytes"),
        ("op:\n  ernie_image: {local_service_conf: {devices: [0, true]}}\n", r"devices\.1: Input should be a valid integer"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting_as_the_file_writes_it(tmp_path, text, words):
    path = tmp_path / "config.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words) as refused:
        build_config(str(path))
    assert str(refused.value).startswith(str(path))


def test_error_messages_are_bounded_however_large_the_input(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text("host: '" + "x" * 60_000 + " y'\n" + "".join(f"op_{i}: 1\n" for i in range(3)))
    with pytest.raises(ConfigError, match="unknown key 'op_0'"):
        build_config(str(path))
    keys = ("http_port", "max_queue", "max_connections", "keep_alive_s", "body_timeout_s", "header_timeout_s")
    path.write_text("".join(f"{key}: -1\n" for key in keys))
    with pytest.raises(ConfigError) as refused:
        build_config(str(path))
    assert len(str(refused.value)) < 2000 and str(refused.value).endswith("; and 1 more")
    path.write_text("x" * (65 * 1024))
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        build_config(str(path))


def test_flags_are_derived_from_the_settings_model_and_obey_the_same_bounds(capsys):
    from dgx_assets.cli import build_parser
    from dgx_assets.serving.config import ServingConfig

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # argparse keeps subparsers there
    helps = {action.dest: action.help for action in serve._actions}
    for name, field in ServingConfig.model_fields.items():
        if name != "limits":
            assert helps[name].startswith(field.description), name
    # The documented command line and every flag users relied on before still parse.
    args = parser.parse_args(
        "serve --model-dir d --host 0.0.0.0 --port 1 --config c --token-env T --no-ir-optim --gpu-ids 0,1 --device cpu "
        "--max-body-bytes 2048 --engine-option a=1 --engine-option b=2 --header-timeout-s 1.5".split()
    )
    config = build_config(None, **{k: v for k, v in vars(args).items() if k in ServingConfig.model_fields})
    assert (config.port, config.ir_optim, config.gpu_ids, config.engine_options) == (1, False, (0, 1), (("a", "1"), ("b", "2")))
    for bad in (["--port", "true"], ["--concurrency", "3.99"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
    assert "invalid int value: '3.99'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--concurrency: Input should be greater than or equal to 1 \(got 0\)"):
        build_config(None, concurrency=0)
    with pytest.raises(ConfigError, match=r"--header-timeout-s: Input should be a finite number"):
        build_config(None, header_timeout_s=float("inf"))


def test_a_bad_file_value_is_refused_even_where_a_flag_overrides_it(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text("http_port: .inf\n")
    with pytest.raises(ConfigError, match=r"http_port: Input should be a valid integer"):
        build_config(str(path), port=0)


def test_serve_refuses_a_model_dir_that_holds_no_model(tmp_path, caplog):
    from dgx_assets.serving.server import serve

    (tmp_path / "notes.txt").write_text("not a model")
    with caplog.at_level("ERROR", logger="dgx_assets.serving"):
        assert serve(build_config(None, model_dir=str(tmp_path), port=0)) == 2
    assert f"no model in {tmp_path}" in caplog.text and "build-generator" in caplog.text
