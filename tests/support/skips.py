"""CI's rule on skipped tests: a skip fails the run unless the allow-list in tests/conftest.py names it, with why.

A skip that nobody declared usually means a missing package or tool silently turned a test off (the ELPV
data, Ray, a browser); in CI that must be a failure, not a line in the summary. Plain functions here, the
pytest hooks in tests/conftest.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Skip:
    nodeid: str  # a test, or a module skipped while it was collected (pytest.importorskip at module level)
    reason: str


def enforced(environ=os.environ) -> bool:
    """On in CI: CI set to anything but empty, 0 or false (`.ci/run` exports CI=true; so do most CI services)."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def allowed_reason(nodeid: str, allowed: dict[str, str]) -> str | None:
    """The declared reason for a skip of `nodeid`: a key of `allowed` is a node id or an fnmatch pattern."""
    for pattern, reason in allowed.items():
        if nodeid == pattern or fnmatchcase(nodeid, pattern):
            return reason
    return None


def undeclared(skips: list[Skip], allowed: dict[str, str]) -> list[Skip]:
    return [skip for skip in skips if allowed_reason(skip.nodeid, allowed) is None]


def skip_from_report(report) -> Skip | None:
    """The Skip a pytest report stands for; None when it is no skip (xfail reports are skipped, too)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return Skip(report.nodeid, reason.removeprefix("Skipped: "))


def validate(allowed: dict[str, str]) -> None:
    """Every entry says why: an allow-list of bare names would hide tests as well as no list at all."""
    blank = [pattern for pattern, reason in allowed.items() if not str(reason).strip()]
    if blank:
        raise ValueError(f"allowed skips need a reason: {', '.join(blank)}")
