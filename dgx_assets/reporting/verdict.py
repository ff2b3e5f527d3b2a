"""The report's overall verdict, from the asset checks' latest results and a few data signals."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckOutcome:
    asset: str
    check: str
    partition: str | None
    passed: bool
    severity: str  # "ERROR" blocks downstream; "WARN" does not
    summary: str = ""  # what to fix when failed, what it found when passed
    blocking: bool = False  # a blocking check holds back what follows it when it fails
    great_expectations: bool = False  # a Great Expectations suite made the result
    found: str = ""  # what the check measured (figures against thresholds where it has them)
    fix: str = ""  # what to fix, when it failed
    figures: tuple[tuple[str, float, str, float], ...] = ()  # (name, figure, "min" or "max", threshold) it gated on

    @property
    def where(self) -> str:
        return f"{self.asset}[{self.partition}]" if self.partition else self.asset


@dataclass(frozen=True)
class Verdict:
    level: str  # pass / warn / fail
    reasons: list[str]


def decide(
    checks: list[CheckOutcome],
    missing: list[str],
    label_shifts: Sequence[str] = (),
    held_back: str | None = None,
    gate_checks: AbstractSet[tuple[str, str]] = frozenset(),
) -> Verdict:
    """fail: an error-severity check failed, or a version was held back from promotion (`held_back`, which then
    stands for the failed `gate_checks`: (asset, check) pairs). warn: a warning check failed (embedding_drift is
    the drift verdict), the label balance shifted, or an asset not built yet."""
    folded = gate_checks if held_back else set()
    failed = [c for c in checks if not c.passed and c.severity == "ERROR" and (c.asset, c.check) not in folded]
    warned = [c for c in checks if not c.passed and c.severity != "ERROR"]
    reasons = [held_back] if held_back else []
    reasons += [
        f"{'blocking check' if c.blocking else 'check'} {c.check} failed on {c.where}" + (f": {c.summary}" if c.summary else "")
        for c in failed
    ]
    reasons += [f"warning check {c.check} failed on {c.where}" + (f": {c.summary}" if c.summary else "") for c in warned]
    reasons += [f"label balance shifted: {shift}" for shift in label_shifts]
    reasons += [f"{asset} has not been materialized" for asset in missing]
    if failed or held_back:
        return Verdict("fail", reasons)
    if reasons:
        return Verdict("warn", reasons)
    return Verdict("pass", [f"all {len(checks)} check results passed, no drift or label shift, every asset present"])
