"""The serving process's settings, declared once: defaults, then the operator's config file, then flags.

``ServingConfig`` is the one declaration: types, finite bounds, defaults and descriptions. The
`dgx-assets serve` flags are derived from its fields (``dgx_assets.flags``, help from the descriptions),
and so is the config file, whose key for each field is its ``file`` entry. Validation is strict: ``true``
is no port, 3.99 no count, ``.inf`` no timeout, and every error names the setting, bounded in length.

The file follows Paddle Serving's pipeline `config.yml` layout, which DGX operators already keep per model
(`http_port`, `op.<service>.concurrency`, `op.<service>.local_service_conf.{model_config, device_type,
devices, ir_optim}`), plus a `limits` block and `max_body_size` for what this server enforces. Keys of
Paddle Serving's own that do not apply here (`rpc_port`, `dag`, ...) are accepted and ignored, so an
existing file can be reused; misspelt keys of ours, duplicate keys and YAML anchors or aliases are errors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# A generation request is a prompt and a few numbers: 256 tokens of Chinese escaped as \\uXXXX is about
# 4.6 KB. 16 KiB leaves room for long prompts the server truncates, and nothing for a memory attack.
DEFAULT_MAX_BODY_BYTES = 16 * 1024
DEFAULT_ENGINE = "dgx_assets.serving.engine:load_engine"
MAX_FILE_BYTES = 64 * 1024  # deploy/serving/config.yml is 2.6 KB
SERVICE = "<service>"  # stands for the one key under `op` in a file key
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
_STRICT = ConfigDict(strict=True, frozen=True, extra="forbid")


class ConfigError(ValueError):
    """The config file or flags are wrong; the message says which setting and why."""


def _setting(default: Any, description: str, file: str, flag: dict | None = None, **bounds: Any) -> Any:
    """A field with its description (the flag's help) and its key in the config file."""
    return Field(default, description=description, json_schema_extra={"file": file, **(flag or {})}, **bounds)


def _seconds(default: float, description: str, file: str) -> Any:
    return _setting(default, description, file, gt=0, le=3600, allow_inf_nan=False)


_OP = f"op.{SERVICE}"
_LOCAL = f"{_OP}.local_service_conf"


class Limits(BaseModel):
    """What one generation request may ask for (the `limits` block of the file)."""

    model_config = _STRICT

    min_side: int = Field(default=16, ge=1, le=16384, description="smallest width or height a request may ask for")
    max_side: int = Field(default=2048, ge=1, le=16384, description="largest width or height")
    max_pixels: int = Field(default=2048 * 2048, ge=1, le=16384**2, description="largest width x height")
    max_images: int = Field(default=4, ge=1, le=64, description="images per request (`n`)")
    max_steps: int = Field(default=100, ge=1, le=10_000, description="largest num_inference_steps")
    max_prompt_tokens: int | None = Field(
        default=None, ge=1, le=65_536, description="prompt tokens kept (longer prompts are cut); none: the model's own limit"
    )


class ServingConfig(BaseModel):
    """Every setting of the serving process; `file` names its key in the config file."""

    model_config = _STRICT

    model_dir: str | None = _setting(
        None, "folder with <name>.json + <name>.pdiparams", f"{_LOCAL}.model_config", max_length=4096
    )
    host: str = _setting("127.0.0.1", "bind address", "host", pattern=r"^\S+$", max_length=255)
    port: int = _setting(9998, "port; 0 picks a free one", "http_port", ge=0, le=65535)
    service_name: str = _setting(
        "ernie_image", "pipeline route name: POST /<service_name>/prediction", "op", pattern=r"^[A-Za-z0-9_\-]{1,64}$"
    )
    device: Literal["auto", "cpu", "gpu"] = _setting("auto", "where the model runs", f"{_LOCAL}.device_type")
    gpu_ids: tuple[int, ...] = _setting(
        (0,), "GPU ids, e.g. 0 or 0,1 (the first is used)", f"{_LOCAL}.devices", min_length=1, max_length=64
    )
    ir_optim: bool = _setting(True, "Paddle Inference graph optimisation", f"{_LOCAL}.ir_optim")
    concurrency: int = _setting(1, "predictors running at once", f"{_OP}.concurrency", ge=1, le=256)
    cpu_threads: int = _setting(1, "CPU math threads", f"{_LOCAL}.thread_num", ge=1, le=1024)
    gpu_memory_mb: int = _setting(512, "initial GPU memory pool in MB", f"{_LOCAL}.gpu_memory_mb", ge=1, le=1 << 20)
    request_timeout_s: float = _seconds(60.0, "longest wait for a free predictor before 503 / err_no 6000", "request_timeout_s")
    max_body_bytes: int = _setting(
        DEFAULT_MAX_BODY_BYTES,
        "request body limit in bytes (the file also takes 16KB, 1MB)",
        "max_body_size",
        ge=1024,
        le=1024**3,
    )
    token_env: str | None = _setting(
        None, "environment variable holding the bearer token", "token_env", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
    )
    default_size: tuple[int, int] = _setting(
        (1024, 1024), "size when a request gives none, WIDTHxHEIGHT", "default_size", flag={"default_text": "1024x1024"}
    )
    limits: Limits = Field(default_factory=Limits, json_schema_extra={"file": "limits"})
    # What holds under abuse: open connections (each beyond gets 503 and is closed), generation requests
    # admitted beyond the running ones, the time a client gets for its TLS handshake, its request head and
    # its body, and how long an idle keep-alive connection stays open.
    max_connections: int = _setting(2048, "open connections, handshaking ones included", "max_connections", ge=1, le=65_536)
    max_queue: int = _setting(32, "generation requests waiting beyond the running ones before 503", "max_queue", ge=0, le=65_536)
    handshake_timeout_s: float = _seconds(10.0, "time to finish the TLS handshake", "handshake_timeout_s")
    header_timeout_s: float = _seconds(10.0, "time to send a request head", "header_timeout_s")
    body_timeout_s: float = _seconds(10.0, "time to send a request body", "body_timeout_s")
    keep_alive_s: float = _seconds(30.0, "idle keep-alive connections are closed after this", "keep_alive_s")
    tls_cert: str | None = _setting(None, "PEM certificate chain: serve HTTPS (TLS 1.2 minimum)", "tls_cert", max_length=4096)
    tls_key: str | None = _setting(None, "PEM private key of --tls-cert", "tls_key", max_length=4096)
    # "module:callable" taking this config and returning an object with tokenize() and generate() (engine.py).
    engine: str = _setting(
        DEFAULT_ENGINE,
        "engine factory 'package.module:callable' (default: the exported Paddle generator)",
        "engine",
        pattern=r"^[A-Za-z0-9_.]+:[A-Za-z0-9_.]+$",
        max_length=200,
    )
    engine_options: tuple[tuple[str, str], ...] = _setting(
        (),
        "option passed to the engine factory (repeatable)",
        "engine_options",
        flag={"flag": "--engine-option", "repeat": True, "metavar": "NAME=VALUE"},
        max_length=64,
    )

    @field_validator("gpu_ids", mode="before")
    @classmethod
    def _gpu_ids(cls, value: Any) -> Any:
        if type(value) is int:
            return (value,)
        if type(value) is str:
            if not re.fullmatch(r"\s*\d{1,4}(\s*,\s*\d{1,4})*\s*", value):
                raise ValueError('GPU ids look like "0" or "0,1"')
            return tuple(int(part) for part in value.split(","))
        return tuple(value) if type(value) is list else value

    @field_validator("max_body_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return parse_bytes(value) if type(value) is str else value

    @field_validator("default_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value) if type(value) is str else value

    @field_validator("engine_options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        return parse_options(value) if type(value) in (dict, list) else value

    @model_validator(mode="after")
    def _consistent(self) -> ServingConfig:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both a certificate (tls_cert) and its key (tls_key)")
        limits, (width, height) = self.limits, self.default_size
        if limits.min_side > limits.max_side:
            raise ValueError("limits: need min_side <= max_side")
        if not (limits.min_side <= width <= limits.max_side and limits.min_side <= height <= limits.max_side):
            raise ValueError(f"default size {width}x{height} is outside the size limits")
        return self


def parse_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d{1,6})\s*[xX*]\s*(\d{1,6})\s*", str(text)[:40])
    if not match:
        raise ValueError(f"size must look like 1024x768, got {str(text)[:40]!r}")
    return int(match.group(1)), int(match.group(2))


def parse_bytes(text: str) -> int:
    """100MB, 100M, 104857600 or 100 MiB -> bytes."""
    match = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,6})?)\s*([KMG]?)(?:i?B)?\s*", text[:40], re.IGNORECASE)
    if not match:
        raise ValueError(f"must be a number of bytes or like '100MB', got {text[:40]!r}")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def parse_options(value: dict | list) -> tuple[tuple[str, str], ...]:
    """{"a": 1} or ["a=1", ...] -> (("a", "1"), ...): engine options, all strings."""
    scalar = (str, int, float, bool)
    if isinstance(value, dict):
        if not all(type(k) is str and type(v) in scalar for k, v in value.items()):
            raise ValueError("engine options map names to plain values")
        return tuple((k, str(v)) for k, v in value.items())
    pairs = []
    for item in value:
        name, sep, text = item.partition("=") if type(item) is str else ("", "", "")
        if not sep or not name.strip():
            raise ValueError(f"engine option must look like NAME=VALUE, got {_shown(item)}")
        pairs.append((name.strip(), text))
    return tuple(pairs)


def _shown(value: Any) -> str:
    """A bounded description of a value from a file or flag (never the repr of a whole structure)."""
    if type(value) in (str, bytes):
        text = repr(value[:40]) + ("..." if len(value) > 40 else "")
    elif value is None or type(value) in (int, float, bool):
        text = repr(value)[:40]
    else:
        return f"a {type(value).__name__}" + (f" of {len(value)} items" if hasattr(value, "__len__") else "")
    return text


# --- the config file ---------------------------------------------------------------------------------------


def _milliseconds(value: Any) -> Any:  # Paddle Serving gives op timeouts in milliseconds
    return value / 1000.0 if type(value) in (int, float) else value


def _device_code(value: Any) -> Any:  # Paddle Serving's codes: 0 cpu, 1 gpu (2+ are TensorRT/XPU/..., not served)
    if type(value) is not int or value not in (0, 1):
        raise ValueError(f"must be 0 (cpu) or 1 (gpu), got {_shown(value)}")
    return "cpu" if value == 0 else "gpu"


# File keys that a field's own `file` key does not cover, and unit or coding conversions by file key.
_EXTRA_KEYS = {f"op.{SERVICE}.timeout": "request_timeout_s"}  # overrides request_timeout_s, as in Paddle Serving
_CONVERT = {f"op.{SERVICE}.timeout": _milliseconds, f"op.{SERVICE}.local_service_conf.device_type": _device_code}
_IGNORED = {"": IGNORED_KEYS, f"op.{SERVICE}": IGNORED_OP_KEYS, f"op.{SERVICE}.local_service_conf": IGNORED_SERVICE_KEYS}


def file_keys() -> dict[str, str]:
    """{file key: field}: each field's `file` entry, plus the keys Paddle Serving spells another way."""
    keys = {str(field.json_schema_extra["file"]): name for name, field in ServingConfig.model_fields.items()}  # type: ignore[index]
    return keys | _EXTRA_KEYS


def _yaml(path: str | Path) -> Any:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """Refuses anchors and aliases (a few lines of them expand to gigabytes) and duplicate keys."""

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ConfigError(f"{path}: line {event.start_mark.line + 1}: YAML anchors and aliases are not accepted")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is None or key in seen:
                    what = "a key that is not a plain name" if key is None else f"duplicate key {key[:40]!r}"
                    raise ConfigError(f"{path}: line {key_node.start_mark.line + 1}: {what}")
                seen.add(key)
            return super().construct_mapping(node, deep)

    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes: not a serving config file")
    try:
        return yaml.load(data.decode("utf-8"), Loader=StrictLoader)  # a SafeLoader
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as error:
        raise ConfigError(f"{path}: not valid YAML: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _read_file(path: str | Path) -> dict[str, tuple[Any, str]]:
    """{field: (value, "<path>: <key>")} for each setting the file sets; op's key overrides the top level's."""
    raw = _yaml(path)
    if raw is None:
        return {}
    keys, found = file_keys(), {}
    _walk(raw, "", "", keys, found, path)
    given = {}
    for pattern in sorted(found, key=lambda p: p.startswith("op.")):
        value, written = found[pattern]
        try:
            value = _CONVERT.get(pattern, lambda v: v)(value)
        except ValueError as error:
            raise ConfigError(f"{path}: {written}: {error}") from None
        given[keys[pattern]] = (value, f"{path}: {written}")
    return given


def _walk(mapping: Any, pattern: str, written: str, keys: dict, found: dict, path) -> None:
    if type(mapping) is not dict:
        raise ConfigError(f"{path}: {written or 'the top level'} must be a mapping, got {_shown(mapping)}")
    for key, value in mapping.items():
        child, shown = f"{pattern}.{key}" if pattern else str(key), f"{written}.{key}" if written else str(key)
        if child == "op":  # `op: {<service>: {...}}`: the key names the service
            if type(value) is not dict or len(value) != 1:
                raise ConfigError(f"{path}: op must hold exactly one service, e.g. `op: {{ernie_image: {{...}}}}`")
            ((service, settings),) = value.items()
            found["op"] = (service, "op")
            _walk(settings or {}, f"op.{SERVICE}", f"op.{service}", keys, found, path)
        elif child in keys:
            found[child] = (value, shown)
        elif any(known.startswith(child + ".") for known in keys):
            _walk(value or {}, child, shown, keys, found, path)
        elif key not in _IGNORED.get(pattern, ()):
            raise ConfigError(f"{path}: unknown key {shown[:80]!r}")


def build_config(config_file: str | None = None, **overrides: Any) -> ServingConfig:
    """Defaults <- config file <- explicit overrides (flags, by field name; None means 'not given'). The file is
    validated whole on its own first: a flag overriding a bad value does not make the file good."""
    from dgx_assets.flags import flag_name

    given = _read_file(config_file) if config_file else {}
    if given:
        _validated(given)
    fields = ServingConfig.model_fields
    for name, value in overrides.items():
        if value is not None:
            given[name] = (value, flag_name(name, fields[name]) if name in fields else name)
    return _validated(given)


def _validated(given: dict[str, tuple[Any, str]]) -> ServingConfig:
    try:
        return ServingConfig(**{name: value for name, (value, _) in given.items()})
    except ValidationError as error:
        raise ConfigError(_describe(error, {name: where for name, (_, where) in given.items()})) from None


def _describe(error: ValidationError, origins: dict[str, str], shown: int = 5) -> str:
    """One line per broken setting, named as it was written (file key or flag), each bounded in length."""
    lines = []
    for item in error.errors()[:shown]:
        loc = [str(part) for part in item["loc"]]
        message = item["msg"].removeprefix("Value error, ")
        if loc:
            setting = origins.get(loc[0], loc[0]) + "".join(f".{part}" for part in loc[1:])
            message = f"{setting}: {message} (got {_shown(item.get('input'))})"
        lines.append(message if len(message) <= 300 else message[:297] + "...")
    more = error.error_count() - shown
    return "; ".join(lines) + (f"; and {more} more" if more > 0 else "")
