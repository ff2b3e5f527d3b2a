"""edge_model's parity gate: its description, its what-to-fix text and its result (emitted by edge_model itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from dgx_assets.edge.parity import GateSettings
from dgx_assets.metadata import gated, number, table, to_fix

if TYPE_CHECKING:
    from dgx_assets.edge.ladder import LadderOutcome

_DEFAULTS = GateSettings()


def gate_description() -> str:
    return (
        "The shipped edge model against trained_model on the test split, the way quantization tools accept a model: "
        f"accuracy at most max_accuracy_drop_points ({_DEFAULTS.max_accuracy_drop_points:g}) below, at most "
        f"max_negative_flip_rate ({_DEFAULTS.max_negative_flip_rate:.0%}) of the images right before and wrong after, "
        f"and no disagreement where trained_model is confident (margin >= confident_margin, {_DEFAULTS.confident_margin:g}, "
        "above any int8 disagreement measured on ELPV: a broken edge path flips such images). Thresholds are "
        "edge_model's settings, recorded with the model. When it fails champion_model holds the version back "
        "(it stays candidate) and says why."
    )


def parity_fix(shipped_format: str, forced: bool) -> str:
    if forced:
        return (
            f"Set `quantization: auto` in edge_model's config so a format that passes ships (float16 keeps "
            f"agreement at about twice int8's size), or, if this device needs {shipped_format}, relax the gate's "
            "thresholds in edge_model's config; then re-materialize edge_model"
        )
    return (
        "No format passed, so the edge path itself differs from trained_model (a wrong input_scale or "
        "resize_method, or raw images unlike the training tensors): compare edge_model.json with image_features' "
        "settings, then re-materialize edge_model"
    )


# Judges the shipped edge model against trained_model. Run inside edge_model's step, where the figures are measured,
# so champion_model (after it) always finds this run's result; not Dagster-blocking: champion_model holds itself back.
PARITY_CHECK = dg.AssetCheckSpec("parity", asset="edge_model", description=gate_description())


def parity_result(ladder: LadderOutcome) -> dg.AssetCheckResult:
    """The check's result for the format the ladder shipped; on failure the description says what to fix."""
    from dgx_assets.edge.convert import AUTO

    report, gate = ladder.shipped.report, ladder.shipped.gate
    forced = ladder.requested != AUTO
    description = (
        f"{report.quantization} ships: " + "; ".join(gate.reasons)
        if not gate.passed
        else f"{report.quantization} decides like trained_model: " + "; ".join(c.text for c in gate.criteria)
    )
    return dg.AssetCheckResult(
        check_name=PARITY_CHECK.name,
        passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=description,
        metadata={
            "format": report.quantization,
            **to_fix("" if gate.passed else parity_fix(report.quantization, forced)),
            # Each criterion's figure beside its limit (max_<name>), the pair the report and champion_model read.
            **{key: value for c in gate.criteria for key, value in gated(c.name, c.value, c.threshold, c.bound).items()},
            "criteria": table(
                ["criterion", "figure", "most allowed", "result"],
                [[c.name, number(c.value), c.threshold, "ok" if c.passed else "**FAILED**"] for c in gate.criteria],
            ),
            "top1_agreement": number(report.top1_agreement),
            "negative_flips": report.negative_flips,
            "positive_flips": report.positive_flips,
            "tflite_test_accuracy": number(report.tflite_accuracy),
            "keras_test_accuracy": number(report.keras_accuracy),
            "test_images": report.images,
        },
    )
