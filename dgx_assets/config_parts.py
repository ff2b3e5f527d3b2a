"""One settings model held inside another: a Dagster config or resource extends a plain settings model."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

Part = TypeVar("Part", bound=BaseModel)


def part_of(settings: BaseModel, part: type[Part]) -> Part:
    """The fields of `part` that `settings` holds, as a plain `part`: what the Dagster-free cores take."""
    return part(**settings.model_dump(include=set(part.model_fields)))
