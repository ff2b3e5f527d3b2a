"""The gate between training and deployment: a new model must beat guessing and not lose to the champion."""

import dataclasses

import dagster as dg
from pydantic import Field

from dgx_assets.metadata import number
from dgx_assets.resources import LakeResource, MlflowResource


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    passed: bool
    reasons: list[str]


def evaluate_gate(
    accuracy: float,
    baseline_accuracy: float,
    champion: tuple[str, float] | None,
    candidate_version: str,
    min_margin: float,
    champion_tolerance: float,
) -> GateVerdict:
    """Accuracy must exceed the majority baseline by ``min_margin`` and trail the champion by at most ``champion_tolerance``."""
    reasons = []
    passed = True
    if accuracy >= baseline_accuracy + min_margin:
        reasons.append(
            f"test accuracy {accuracy:.4f} beats the majority baseline {baseline_accuracy:.4f} by at least {min_margin}"
        )
    else:
        passed = False
        reasons.append(
            f"test accuracy {accuracy:.4f} does not beat the majority baseline {baseline_accuracy:.4f} by {min_margin}: "
            "the model is no better than always answering the most common label"
        )
    if champion is None:
        reasons.append("no champion yet")
    elif champion[0] == candidate_version:
        reasons.append(f"version {candidate_version} is the champion itself")
    elif accuracy >= champion[1] - champion_tolerance:
        reasons.append(f"within {champion_tolerance} of champion v{champion[0]} ({champion[1]:.4f})")
    else:
        passed = False
        reasons.append(
            f"{champion[1] - accuracy:.4f} below champion v{champion[0]} ({champion[1]:.4f}), more than {champion_tolerance}"
        )
    return GateVerdict(passed, reasons)


class ModelGateConfig(dg.Config):
    min_margin_over_baseline: float = Field(
        0.02, description="Accuracy (fraction) the model must gain over always guessing the majority label"
    )
    champion_tolerance: float = Field(0.01, description="Accuracy (fraction) the model may trail the current champion by")


# Blocks everything downstream (edge model, promotion) unless the new model beats guessing and keeps up with the champion.
@dg.asset_check(
    asset="trained_model",
    name="beats_baseline_and_champion",
    blocking=True,
    description=(
        "Test accuracy beats the majority-class baseline by a margin and is within a tolerance of the `champion` version."
    ),
)
def beats_baseline_and_champion(config: ModelGateConfig, lake: LakeResource, mlflow: MlflowResource) -> dg.AssetCheckResult:
    from dgx_assets.tracking.registry import CHAMPION_ALIAS, alias_metric
    from dgx_assets.training.outputs import read_model_info

    info = read_model_info(lake.lake)
    metrics = info["test_metrics"]
    champion = alias_metric(mlflow.resolved_tracking_uri, info["registered_model_name"], CHAMPION_ALIAS, "test_accuracy")
    verdict = evaluate_gate(
        metrics["accuracy"],
        metrics["majority_baseline_accuracy"],
        champion,
        str(info["model_version"]),
        config.min_margin_over_baseline,
        config.champion_tolerance,
    )
    return dg.AssetCheckResult(
        passed=verdict.passed,
        description="; ".join(verdict.reasons),
        metadata={
            "model_version": f"{info['registered_model_name']} v{info['model_version']}",
            "test_accuracy": number(metrics["accuracy"]),
            "majority_baseline_accuracy": number(metrics["majority_baseline_accuracy"]),
            "champion": f"v{champion[0]} ({champion[1]:.4f})" if champion else "none",
        },
    )
