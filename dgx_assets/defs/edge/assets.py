import dagster as dg

from dgx_assets import links
from dgx_assets.defs.edge.checks import PARITY_CHECK, parity_result
from dgx_assets.defs.resources import LakeResource, MlflowResource
from dgx_assets.edge.config import EdgeModelConfig
from dgx_assets.metadata import human_size, number, table

EDGE_OWNERS = ["team:ml-platform"]


# Converts trained_model into the TFLite model edge devices run, measures parity, exports for Triton.
@dg.asset(
    deps=["trained_model"],
    group_name="edge",
    kinds={"tensorflow", "tflite", "mlflow"},
    owners=EDGE_OWNERS,
    code_version="2",  # up when the same trained_model would convert otherwise: docs/decisions/0004
    check_specs=[PARITY_CHECK],
    description=(
        "trained_model as a TFLite model for inspection stations: takes decoded uint8 pixels at the raw camera "
        "size ([1, raw_height, raw_width, C]), resizes and normalises inside, returns class probabilities. "
        "Its format comes from a ladder: full-integer int8 (calibrated on the training split) when it passes the "
        "parity gate on the test split (measured with ai_edge_litert), else float16, else float32; every format "
        "tried is shown, and its `parity` check judges the format shipped. Also a Triton model repository of "
        "trained_model. Logged to the trained model's MLflow run."
    ),
)
def edge_model(
    context: dg.AssetExecutionContext, config: EdgeModelConfig, lake: LakeResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    from dgx_assets.edge.build import build_edge_model

    try:
        result = build_edge_model(lake.lake, config, mlflow.tracking_config().tracking_uri, log=context.log.info)
    except ValueError as error:  # missing upstream data or a bad setting: say what to fix, not a traceback
        raise dg.Failure(description=str(error)) from error
    report, spec, ladder = result.report, result.spec, result.ladder
    run_url = result.info.get("mlflow_run_url")
    version_url = links.mlflow_model_version(
        mlflow.tracking_config().ui_url, result.info["registered_model_name"], str(result.info["model_version"])
    )
    return dg.MaterializeResult(
        metadata={
            **({"mlflow_run": dg.MetadataValue.url(run_url)} if run_url else {}),
            "mlflow_model_version": dg.MetadataValue.url(version_url),
            "path": dg.MetadataValue.path(result.uri),
            "format": report.quantization,
            "format_reason": dg.MetadataValue.md(ladder.reason),
            "formats_tried": formats_table(ladder),
            "float_layers": dg.MetadataValue.json(spec.float_layers),
            "raw_input": f"uint8 {spec.input_shape} ({spec.signature}/{spec.input_name}), decoded pixels",
            "model_input": dg.MetadataValue.json(spec.model_input_shape),
            "tflite_size": human_size(report.tflite_size_bytes),
            "keras_size": human_size(report.keras_size_bytes),
            "size_ratio": number(report.size_ratio),
            "test_images": report.images,
            "top1_agreement": number(report.top1_agreement),
            "disagreements": report.disagreements,
            "disagreements_near_boundary": report.disagreements_near_boundary,
            "max_probability_difference": number(report.max_probability_difference),
            "tflite_test_accuracy": number(report.tflite_accuracy),
            "keras_test_accuracy": number(report.keras_accuracy),
            "tflite_latency_ms": number(report.tflite_latency_ms),
            "keras_latency_ms": number(report.keras_latency_ms),
            "latency_ratio": number(report.latency_ratio),
            "feature_source": result.data.feature_source,
            "skipped_test_images": dg.MetadataValue.json(result.data.skipped),
            "triton_config": dg.MetadataValue.md(f"```\n{result.triton_config}```"),
            "mlflow_run_id": str(result.mlflow_run_id),
            "model_version": f"{result.info['registered_model_name']} v{result.info['model_version']}",
        },
        check_results=[parity_result(ladder)],
    )


def formats_table(ladder) -> dg.MetadataValue:
    """Every format the ladder tried, against trained_model on the test images."""
    rows = [
        [
            t["format"],
            f"{t['size_ratio']:.3f}",
            f"{t['latency_ratio']:.2f}",
            f"{t['accuracy']:.2%}",
            f"{t['agreement']:.2%}",
            f"{t['negative_flips']} ({t['negative_flip_rate']:.1%})",
            "pass" if t["passed"] else "fail",
        ]
        for t in ladder.summary()["trials"]
    ]
    return table(["format", "size ratio", "latency ratio", "accuracy", "agreement", "negative flips", "gate"], rows)
