from typing import Optional

import dagster as dg
from pydantic import Field

from dgx_assets import links
from dgx_assets.metadata import number
from dgx_assets.resources import LakeResource, MlflowResource

EDGE_OWNERS = ["team:ml-platform"]


class EdgeModelConfig(dg.Config):
    quantization: str = Field("int8", description="int8 (full-integer, calibrated), float16 or dynamic (range)")
    raw_height: Optional[int] = Field(None, description="Raw input height the device feeds; default: most common image size")
    raw_width: Optional[int] = Field(None, description="Raw input width the device feeds; default: most common image size")
    resize_method: str = Field("bilinear_antialias", description="bilinear_antialias (as image_features), bilinear or nearest")
    input_scale: float = Field(1.0, description="Factor on raw pixels before the network; 1.0: trained_model rescales itself")
    representative_samples: int = Field(200, description="Calibration images for int8, from the representative split")
    representative_split: str = Field("train", description="raw_images split the calibration images come from")
    max_test_images: int = Field(1000, description="Test images for parity (0: all)")
    latency_images: int = Field(100, description="Images timed one by one, on both models")
    num_threads: Optional[int] = Field(None, description="TFLite CPU threads (None: the runtime's default)")
    triton_model_name: str = Field("defect_classifier", description="Folder name in the Triton model repository")
    triton_max_batch_size: int = Field(8, description="max_batch_size in config.pbtxt (0: no batching)")


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
def edge_model(context: dg.AssetExecutionContext, config: EdgeModelConfig, lake: LakeResource,
               mlflow: MlflowResource) -> dg.MaterializeResult:
    from dgx_assets.edge.build import EdgeBuildSettings, build_edge_model

    settings = EdgeBuildSettings(**config.model_dump())
    try:
        result = build_edge_model(lake.lake, settings, mlflow.resolved_tracking_uri, log=context.log.info)
    except ValueError as error:  # missing upstream data or a bad setting: say what to fix, not a traceback
        raise dg.Failure(description=str(error)) from error
    report, spec = result.report, result.spec
    run_url = result.info.get("mlflow_run_url")
    version_url = links.mlflow_model_version(mlflow.resolved_ui_url, result.info["registered_model_name"],
                                             str(result.info["model_version"]))
    return dg.MaterializeResult(
        metadata={
            **({"mlflow_run": dg.MetadataValue.url(run_url)} if run_url else {}),
            "mlflow_model_version": dg.MetadataValue.url(version_url),
            "path": dg.MetadataValue.path(result.uri),
            "quantization": report.quantization,
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
