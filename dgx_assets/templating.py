"""Jinja2 for the pages we write (the quality report and its sections): one environment per package's
`templates/` folder, autoescaping on, a missing variable an error rather than an empty string."""

from __future__ import annotations

import functools
import re

import jinja2
from markupsafe import Markup, escape

_CODE = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")  # CJK ideographs


def fmt(value) -> str:
    """A table cell as people read it: floats to 4 significant digits, None as nothing."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def inline_markdown(text) -> Markup:
    """The inline Markdown our reasons and descriptions use (`code`, **strong**) as HTML, everything else escaped."""
    parts = _CODE.split(str(text))  # even indexes: prose; odd: the inside of a code span
    html = [
        f"<code>{escape(part)}</code>" if index % 2 else _STRONG.sub(r"<strong>\1</strong>", str(escape(part)))
        for index, part in enumerate(parts)
    ]
    return Markup("".join(html))


def language(text) -> str:
    """`zh-Hans` for text in Chinese, so the browser picks a CJK font for it (and for its line breaks); else `en`."""
    return "zh-Hans" if _HAN.search(str(text)) else "en"


@functools.cache
def environment(package: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=fmt, md=inline_markdown, language=language)
    return env


def render(package: str, template: str, **context) -> str:
    return environment(package).get_template(template).render(**context)
