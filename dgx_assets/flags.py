"""Command-line flags derived from a pydantic settings model: one flag per field, its help the field's description.

A settings model is declared once; ``add_model_flags`` turns its fields into argparse flags (``--max-queue``
for ``max_queue``, or the name a field gives as ``json_schema_extra={"flag": ...}``), and ``given_flags``
reads back only the flags the user gave, so a config file's values stand where no flag overrides them.
Values are left for the model to validate (strictly), so a flag and a file setting obey the same rules.
Cheap to import: argparse and pydantic only.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def flag_name(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("flag") or "--" + name.replace("_", "-"))


def _flag_options(field: FieldInfo) -> dict[str, Any]:
    annotation = field.annotation
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]  # Optional[X]: None is what "not given" already means
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    default = extra.get("default_text", field.get_default(call_default_factory=True))
    shown = "" if default is None or default == () else f" (default {_shown(default)})"
    options: dict[str, Any] = {"default": None, "help": (field.description or "") + shown}
    if extra.get("repeat"):
        options.update(action="append", metavar=str(extra.get("metavar", "VALUE")))
    elif annotation is bool:
        options["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(annotation) is typing.Literal:
        options["choices"] = list(typing.get_args(annotation))
    elif annotation in (int, float):
        options["type"] = annotation  # "3.99" for an int or "true" for a port fail here, as the model would
    return options


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], skip: Iterable[str] = ()) -> None:
    """One flag per field of `model` that holds a value (nested models are set in files, not flags)."""
    skipped = set(skip)
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if name in skipped or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        parser.add_argument(flag_name(name, field), dest=name, **_flag_options(field))


def given_flags(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, tuple[Any, str]]:
    """{field: (value, flag)} for each flag of `model` the user gave (a flag left out is None)."""
    given = {}
    for name, field in model.model_fields.items():
        value = getattr(args, name, None)
        if value is not None:
            given[name] = (value, flag_name(name, field))
    return given
