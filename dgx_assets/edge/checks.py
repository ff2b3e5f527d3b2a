import dagster as dg
from pydantic import Field

from dgx_assets.metadata import number
from dgx_assets.resources import LakeResource


class ParityGateConfig(dg.Config):
    min_agreement: float = Field(0.99, description="Least top-1 agreement of TFLite with trained_model (fraction)")
    max_accuracy_drop_points: float = Field(1.0, description="Most TFLite test accuracy may fall below Keras, in points")


# Blocks champion_model (the promotion) unless the edge model agrees with trained_model on the test split.
# Training longer is not in the advice: on ELPV it moved int8 agreement little, and either way (the classifiers
# flip on sub-grey-level input noise; 7 epochs instead of 5: 15 of 398 disagree instead of 18), while float16
# agreed on 397 or all 398 test images.
@dg.asset_check(
    asset="edge_model",
    name="parity",
    blocking=True,
    description=(
        "TFLite top-1 agreement with trained_model at least min_agreement (99 %) and test accuracy at most "
        "max_accuracy_drop_points (1) below it. Blocking: champion_model does not run when it fails."
    ),
)
def edge_model_parity(config: ParityGateConfig, lake: LakeResource) -> dg.AssetCheckResult:
    from dgx_assets.edge.build import read_parity
    from dgx_assets.edge.parity import ParityReport, evaluate_gate

    report = ParityReport(**read_parity(lake.lake)["report"])
    gate = evaluate_gate(report, config.min_agreement, config.max_accuracy_drop_points / 100.0)
    return dg.AssetCheckResult(
        passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            "; ".join(gate.reasons) + ". To fix: set `quantization: float16` in edge_model's config (about twice "
            "the int8 model's size and latency), or keep the layers that lose most in float with `float_layers`, "
            "then re-materialize edge_model"
        )
        if not gate.passed
        else "edge model agrees with trained_model",
        metadata={
            "top1_agreement": number(report.top1_agreement),
            "min_agreement": config.min_agreement,
            "tflite_test_accuracy": number(report.tflite_accuracy),
            "keras_test_accuracy": number(report.keras_accuracy),
            "accuracy_drop_points": number((report.keras_accuracy - report.tflite_accuracy) * 100, 2),
            "max_accuracy_drop_points": config.max_accuracy_drop_points,
            "test_images": report.images,
        },
    )
