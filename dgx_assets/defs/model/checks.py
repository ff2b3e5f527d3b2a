"""The gate between training and deployment: a new model must beat guessing and not lose to the champion."""

import dagster as dg
from pydantic import BaseModel, Field

from dgx_assets.gates import Criterion, Gate
from dgx_assets.metadata import gated, number, to_fix


def evaluate_gate(
    accuracy: float,
    baseline_accuracy: float,
    champion: tuple[str, float] | None,
    candidate_version: str,
    min_margin: float,
    champion_tolerance: float,
) -> Gate:
    """Accuracy must exceed the majority baseline by ``min_margin`` and trail the champion by at most
    ``champion_tolerance``. The gate's detail says each finding, passed or not."""
    beats = accuracy >= baseline_accuracy + min_margin
    criteria = [
        Criterion(
            "test_accuracy",
            accuracy,
            baseline_accuracy + min_margin,
            beats,
            "min",
            f"test accuracy {accuracy:.4f} beats the majority baseline {baseline_accuracy:.4f} by at least {min_margin}"
            if beats
            else f"test accuracy {accuracy:.4f} does not beat the majority baseline {baseline_accuracy:.4f} by {min_margin}: "
            "the model is no better than always answering the most common label",
        )
    ]
    if champion is None:
        notes = ["no champion yet"]
    elif champion[0] == candidate_version:
        notes = [f"version {candidate_version} is the champion itself"]
    else:
        notes = []
        near = accuracy >= champion[1] - champion_tolerance
        criteria.append(
            Criterion(
                "test_accuracy_against_champion",
                accuracy,
                champion[1] - champion_tolerance,
                near,
                "min",
                f"within {champion_tolerance} of champion v{champion[0]} ({champion[1]:.4f})"
                if near
                else f"{champion[1] - accuracy:.4f} below champion v{champion[0]} ({champion[1]:.4f}), "
                f"more than {champion_tolerance}",
            )
        )
    detail = "; ".join([c.sentence for c in criteria] + notes)
    return Gate.of("trained_model.beats_baseline_and_champion", criteria, detail)


class ModelGateSettings(BaseModel):
    """trained_model's promotion gate, judged in its own step (TrainedModelConfig carries these fields)."""

    min_margin_over_baseline: float = Field(
        default=0.02, description="Accuracy (fraction) the model must gain over always guessing the majority label"
    )
    champion_tolerance: float = Field(default=0.01, description="Accuracy (fraction) the model may trail the current champion by")


# Judged inside trained_model's step, so edge_model and champion_model (after it) always find this version's result.
# Not Dagster-blocking: a failing gate holds the promotion back in champion_model, and the run goes on to the report.
MODEL_GATE_CHECK = dg.AssetCheckSpec(
    "beats_baseline_and_champion",
    asset="trained_model",
    description=(
        "Test accuracy beats the majority-class baseline by a margin and is within a tolerance of the `champion` version."
    ),
)


def model_gate_result(info: dict, tracking_uri: str, settings: ModelGateSettings) -> dg.AssetCheckResult:
    """The gate on the version trained_model just registered (``info``: its model_info.json)."""
    from dgx_assets.tracking.registry import CHAMPION_ALIAS, alias_metric

    metrics = info["test_metrics"]
    champion = alias_metric(tracking_uri, info["registered_model_name"], CHAMPION_ALIAS, "test_accuracy")
    gate = evaluate_gate(
        metrics["accuracy"],
        metrics["majority_baseline_accuracy"],
        champion,
        str(info["model_version"]),
        settings.min_margin_over_baseline,
        settings.champion_tolerance,
    )
    fix = (
        ""
        if gate.passed
        else "Train a better model (trained_model's config, more or cleaner data), or, if this version "
        "should ship anyway, relax min_margin_over_baseline or champion_tolerance in trained_model's config"
    )
    return dg.AssetCheckResult(
        check_name=MODEL_GATE_CHECK.name,
        passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=gate.detail,
        metadata={
            **to_fix(fix),
            "model_version": f"{info['registered_model_name']} v{info['model_version']}",
            # test_accuracy beside min_test_accuracy: the report and champion_model show it as any gated figure
            **gated(
                "test_accuracy",
                metrics["accuracy"],
                metrics["majority_baseline_accuracy"] + settings.min_margin_over_baseline,
                "min",
            ),
            "majority_baseline_accuracy": number(metrics["majority_baseline_accuracy"]),
            "min_margin_over_baseline": settings.min_margin_over_baseline,
            "champion_tolerance": settings.champion_tolerance,
            "champion": f"v{champion[0]} ({champion[1]:.4f})" if champion else "none",
        },
    )
