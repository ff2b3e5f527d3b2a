"""One shape for every gate: criteria (a figure against its threshold) and the gate that holds them.

The parity gate (edge/parity.py), trained_model's gate (defs/model/checks.py) and the promotion decision
(edge/promotion.py, defs/edge/champion.py) all judge with these. Plain Python: no Dagster, no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

SLACK = 1e-9  # floating-point tolerance of every threshold comparison (1 image in 10**9)
BOUNDS = ("max", "min")


def within(value: float, bound: str, threshold: float) -> bool:
    """Is `value` at most (`max`) or at least (`min`) `threshold`, up to SLACK?"""
    if bound not in BOUNDS:
        raise ValueError(f"bound is min or max, not {bound!r}")
    return value <= threshold + SLACK if bound == "max" else value >= threshold - SLACK


@dataclass(frozen=True)
class Criterion:
    """One figure a gate judges against its threshold: at most (`max`) or at least (`min`)."""

    name: str
    value: float
    threshold: float
    passed: bool
    bound: str = "max"
    text: str = ""  # the figure against its threshold as a sentence a person reads; empty: `summary()`

    @classmethod
    def judge(cls, name: str, value: float, bound: str, threshold: float, text: str = "") -> Criterion:
        """The criterion with `passed` decided by comparing `value` with `threshold`."""
        return cls(name, value, threshold, within(value, bound, threshold), bound, text)

    @property
    def threshold_text(self) -> str:
        return f"{'at most' if self.bound == 'max' else 'at least'} {self.threshold:.4g}"

    def summary(self) -> str:
        """The figure, its threshold and the result in one short line: `0.01 (at most 0.02): passed`."""
        return f"{self.value:.4g} ({self.threshold_text}): {'passed' if self.passed else 'failed'}"

    @property
    def sentence(self) -> str:
        return self.text or f"{self.name} {self.summary()}"


@dataclass(frozen=True)
class Gate:
    """A gate's outcome: whether it passed, what it found, on failure what to fix, the criteria it judged, and
    the settings it judged them with."""

    name: str
    passed: bool
    detail: str = ""
    criteria: tuple[Criterion, ...] = ()
    settings: dict = field(default_factory=dict)
    to_fix: str = ""

    @classmethod
    def of(cls, name: str, criteria: Iterable[Criterion], detail: str = "", settings: dict | None = None) -> Gate:
        """The gate that passes when every one of `criteria` did."""
        criteria = tuple(criteria)
        return cls(name, all(c.passed for c in criteria), detail, criteria, dict(settings or {}))

    @property
    def reasons(self) -> list[str]:
        """Why it failed: the sentence of each failed criterion (empty when all passed)."""
        return [c.sentence for c in self.criteria if not c.passed]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "criteria": [asdict(c) for c in self.criteria], "settings": self.settings}
