import dagster as dg

from dgx_assets import links
from dgx_assets.edge.config import EdgeModelConfig
from dgx_assets.metadata import number
from dgx_assets.resources import LakeResource, MlflowResource

EDGE_OWNERS = ["team:ml-platform"]


# Converts trained_model into the TFLite model edge devices run, measures parity, exports for Triton.
@dg.asset(
    deps=["trained_model"],
    group_name="edge",
    kinds={"tensorflow", "tflite", "mlflow"},
    owners=EDGE_OWNERS,
    code_version="1",
    description=(
        "trained_model as a TFLite model for inspection stations: takes decoded uint8 pixels at the raw camera "
        "size ([1, raw_height, raw_width, C]), resizes and normalises inside, returns class probabilities. "
        "int8 by default, calibrated on the training split; parity with trained_model measured on the test "
        "split with ai_edge_litert. Also a Triton model repository of trained_model. Logged to the trained "
        "model's MLflow run."
    ),
)
def edge_model(
    context: dg.AssetExecutionContext, config: EdgeModelConfig, lake: LakeResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    from dgx_assets.edge.build import build_edge_model

    try:
        result = build_edge_model(lake.lake, config, mlflow.resolved_tracking_uri, log=context.log.info)
    except ValueError as error:  # missing upstream data or a bad setting: say what to fix, not a traceback
        raise dg.Failure(description=str(error)) from error
    report, spec = result.report, result.spec
    run_url = result.info.get("mlflow_run_url")
    version_url = links.mlflow_model_version(
        mlflow.resolved_ui_url, result.info["registered_model_name"], str(result.info["model_version"])
    )
    return dg.MaterializeResult(
        metadata={
            **({"mlflow_run": dg.MetadataValue.url(run_url)} if run_url else {}),
            "mlflow_model_version": dg.MetadataValue.url(version_url),
            "path": dg.MetadataValue.path(result.uri),
            "quantization": report.quantization,
            "float_layers": dg.MetadataValue.json(spec.float_layers),
            "raw_input": f"uint8 {spec.input_shape} ({spec.signature}/{spec.input_name}), decoded pixels",
            "model_input": dg.MetadataValue.json(spec.model_input_shape),
            "tflite_size_bytes": report.tflite_size_bytes,
            "keras_size_bytes": report.keras_size_bytes,
            "size_ratio": number(report.size_ratio),
            "test_images": report.images,
            "top1_agreement": number(report.top1_agreement),
            "disagreements": report.disagreements,
            "disagreements_near_boundary": report.disagreements_near_boundary,
            "max_probability_difference": number(report.max_probability_difference),
            "tflite_test_accuracy": number(report.tflite_accuracy),
            "keras_test_accuracy": number(report.keras_accuracy),
            "tflite_latency_ms": number(report.tflite_latency_ms, 3),
            "keras_latency_ms": number(report.keras_latency_ms, 3),
            "latency_ratio": number(report.latency_ratio),
            "feature_source": result.data.feature_source,
            "skipped_test_images": dg.MetadataValue.json(result.data.skipped),
            "triton_config": dg.MetadataValue.md(f"```\n{result.triton_config}```"),
            "mlflow_run_id": str(result.mlflow_run_id),
            "model_version": f"{result.info['registered_model_name']} v{result.info['model_version']}",
        }
    )
