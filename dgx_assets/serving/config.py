"""The serving process's settings: defaults, then the operator's config file, then command-line flags.

The file follows Paddle Serving's pipeline `config.yml` layout, which DGX operators already keep per
model (`http_port`, `op.<service>.concurrency`, `op.<service>.local_service_conf.{model_config,
device_type, devices, ir_optim}`), plus a `limits` block and `max_body_size` for what this server
enforces (body size, connection and queue caps, header/body/keep-alive timeouts, TLS files). Keys of Paddle Serving's
own that do not apply here (`rpc_port`, `dag`, ...) are accepted and
ignored so an existing file can be reused; misspelt keys of ours are errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

# A generation request is a prompt and a few numbers: 256 tokens of Chinese escaped as \\uXXXX is about
# 4.6 KB. 16 KiB leaves room for long prompts the server truncates, and nothing for a memory attack.
DEFAULT_MAX_BODY_BYTES = 16 * 1024
DEFAULT_ENGINE = "dgx_assets.serving.engine:load_engine"
# Paddle Serving keys that are valid in an operator's file but mean nothing to this server.
IGNORED_KEYS = {
    "rpc_port",
    "worker_num",
    "build_dag_each_worker",
    "dag",
    "grpc_gateway_port",
    "prometheus_port",
    "enable_prometheus",
}
IGNORED_OP_KEYS = {"client_type", "retry", "batch_size", "auto_batching_timeout"}
IGNORED_SERVICE_KEYS = {
    "fetch_list",
    "precision",
    "use_calib",
    "use_mkldnn",
    "mkldnn_cache_capacity",
    "mkldnn_op_list",
    "mkldnn_bf16_op_list",
    "min_subgraph_size",
    "use_ascend_cl",
}


class ConfigError(ValueError):
    """The config file or flags are wrong; the message says which key and why."""


@dataclass(frozen=True)
class Limits:
    min_side: int = 16
    max_side: int = 2048
    max_pixels: int = 2048 * 2048
    max_images: int = 4  # images per request (`n`)
    max_steps: int = 100
    max_prompt_tokens: int | None = None  # None: the model's own limit (256 for the bundled generator)


@dataclass(frozen=True)
class ServingConfig:
    model_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 9998
    service_name: str = "ernie_image"  # the pipeline route: POST /<service_name>/prediction
    device: str = "auto"  # auto | cpu | gpu
    gpu_ids: tuple[int, ...] = (0,)
    ir_optim: bool = True
    concurrency: int = 1  # predictors (Paddle Serving's op concurrency); each runs one request at a time
    cpu_threads: int = 1
    gpu_memory_mb: int = 512
    request_timeout_s: float = 60.0  # longest wait for a free predictor before answering 503 / err_no 6000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    token_env: str | None = None  # name of the environment variable holding the bearer token
    default_size: tuple[int, int] = (1024, 1024)
    limits: Limits = field(default_factory=Limits)
    # What holds under abuse: open connections (each beyond gets 503 and is closed), generation requests
    # admitted beyond the running ones (503 + Retry-After when full), the time a client gets to send its
    # request head and its body, and how long an idle keep-alive connection stays open.
    max_connections: int = 2048
    max_queue: int = 32
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 30.0
    # TLS (1.2 minimum): PEM certificate chain and key. Both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    # The engine: "module:callable" taking this config and returning an object with tokenize() and
    # generate() (see engine.py); options are passed to it as strings.
    engine: str = DEFAULT_ENGINE
    engine_options: tuple[tuple[str, str], ...] = ()

    def validate(self) -> ServingConfig:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}")
        if self.device not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"device must be auto, cpu or gpu, got {self.device!r}")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", self.service_name):
            raise ConfigError(f"service name must be letters, digits, '_' or '-', got {self.service_name!r}")
        if self.concurrency < 1 or self.cpu_threads < 1:
            raise ConfigError("concurrency and cpu_threads must be at least 1")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_size must be at least 1 KB, got {self.max_body_bytes}")
        if self.max_connections < 1 or self.max_queue < 0:
            raise ConfigError("max_connections must be at least 1 and max_queue at least 0")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be more than 0, got {getattr(self, name)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both a certificate (tls_cert) and its key (tls_key)")
        if not re.fullmatch(r"[\w.]+:[\w.]+", self.engine):
            raise ConfigError(f"engine must look like 'package.module:callable', got {self.engine!r}")
        limits = self.limits
        if not 1 <= limits.min_side <= limits.max_side:
            raise ConfigError("limits: need 1 <= min_side <= max_side")
        width, height = self.default_size
        if not (limits.min_side <= width <= limits.max_side and limits.min_side <= height <= limits.max_side):
            raise ConfigError(f"default size {width}x{height} is outside the size limits")
        return self


def parse_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d{1,6})\s*[xX*]\s*(\d{1,6})\s*", str(text))
    if not match:
        raise ValueError(f"size must look like 1024x768, got {str(text)[:40]!r}")
    return int(match.group(1)), int(match.group(2))


def parse_bytes(value) -> int:
    """100MB, 100M, 104857600 or 100 MiB -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"max_body_size must be a size, got {value!r}")
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ConfigError(f"max_body_size must be a number of bytes or like '100MB', got {value!r}")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def parse_options(value) -> tuple[tuple[str, str], ...]:
    """{"a": 1} or ["a=1", ...] -> (("a", "1"), ...): engine options, all strings."""
    if isinstance(value, dict):
        return tuple((str(k), str(v)) for k, v in value.items())
    pairs = []
    for item in value or ():
        name, sep, text = str(item).partition("=")
        if not sep or not name.strip():
            raise ValueError(f"engine option must look like NAME=VALUE, got {str(item)[:40]!r}")
        pairs.append((name.strip(), text))
    return tuple(pairs)


def load_config_file(path: str | Path) -> dict:
    """The settings a config file sets, as ServingConfig keyword arguments (only those it sets)."""
    import yaml

    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    out: dict = {}
    simple = {
        "http_port": ("port", int),
        "host": ("host", str),
        "token_env": ("token_env", str),
        "request_timeout_s": ("request_timeout_s", float),
        "default_size": ("default_size", parse_size),
        "max_connections": ("max_connections", int),
        "max_queue": ("max_queue", int),
        "header_timeout_s": ("header_timeout_s", float),
        "body_timeout_s": ("body_timeout_s", float),
        "keep_alive_s": ("keep_alive_s", float),
        "tls_cert": ("tls_cert", str),
        "tls_key": ("tls_key", str),
        "engine": ("engine", str),
        "engine_options": ("engine_options", parse_options),
    }
    for key, value in raw.items():
        if key in simple:
            name, convert = simple[key]
            out[name] = _convert(path, key, value, convert)
        elif key == "max_body_size":
            out["max_body_bytes"] = parse_bytes(value)
        elif key == "limits":
            out["limits"] = _limits(path, value)
        elif key == "op":
            out.update(_op(path, value))
        elif key not in IGNORED_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}")
    return out


def _convert(path, key, value, convert):
    try:
        return convert(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {key}: {error}") from error


def _limits(path, value) -> Limits:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: limits must be a mapping")
    names = {f.name for f in fields(Limits)}
    unknown = set(value) - names
    if unknown:
        raise ConfigError(f"{path}: limits: unknown keys {sorted(unknown)} (known: {sorted(names)})")
    return Limits(**{k: _convert(path, f"limits.{k}", v, int) for k, v in value.items()})


def _op(path, value) -> dict:
    if not isinstance(value, dict) or len(value) != 1:
        raise ConfigError(f"{path}: op must hold exactly one service, e.g. `op: {{ernie_image: {{...}}}}`")
    ((service, settings),) = value.items()
    settings = settings or {}
    out: dict = {"service_name": str(service)}
    for key, item in settings.items():
        if key == "concurrency":
            out["concurrency"] = _convert(path, f"op.{service}.concurrency", item, int)
        elif key == "timeout":  # Paddle Serving gives it in milliseconds
            out["request_timeout_s"] = _convert(path, f"op.{service}.timeout", item, float) / 1000.0
        elif key == "local_service_conf":
            out.update(_local_service(path, service, item or {}))
        elif key not in IGNORED_OP_KEYS:
            raise ConfigError(f"{path}: op.{service}: unknown key {key!r}")
    return out


def _local_service(path, service, conf) -> dict:
    out: dict = {}
    where = f"op.{service}.local_service_conf"
    for key, item in conf.items():
        if key == "model_config":
            out["model_dir"] = str(item)
        elif key == "device_type":  # Paddle Serving: 0 cpu, 1 gpu (2+ are TensorRT/XPU/..., not served here)
            kind = {0: "cpu", 1: "gpu"}.get(_convert(path, f"{where}.device_type", item, int))
            if kind is None:
                raise ConfigError(f"{path}: {where}.device_type must be 0 (cpu) or 1 (gpu), got {item!r}")
            out["device"] = kind
        elif key == "devices":
            out["gpu_ids"] = _gpu_ids(path, where, item)
        elif key == "ir_optim":
            if not isinstance(item, bool):
                raise ConfigError(f"{path}: {where}.ir_optim must be true or false, got {item!r}")
            out["ir_optim"] = item
        elif key == "thread_num":
            out["cpu_threads"] = _convert(path, f"{where}.thread_num", item, int)
        elif key == "gpu_memory_mb":
            out["gpu_memory_mb"] = _convert(path, f"{where}.gpu_memory_mb", item, int)
        elif key not in IGNORED_SERVICE_KEYS:
            raise ConfigError(f"{path}: {where}: unknown key {key!r}")
    return out


def _gpu_ids(path, where, item) -> tuple[int, ...]:
    text = ",".join(str(x) for x in item) if isinstance(item, (list, tuple)) else str(item)
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise ConfigError(f'{path}: {where}.devices must be GPU ids like "0,1", got {item!r}') from error


def build_config(config_file: str | None = None, **overrides) -> ServingConfig:
    """Defaults <- config file <- explicit overrides (flags; None means 'not given')."""
    config = ServingConfig()
    if config_file:
        config = replace(config, **load_config_file(config_file))
    given = {key: value for key, value in overrides.items() if value is not None}
    return replace(config, **given).validate()
