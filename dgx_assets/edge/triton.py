"""Export trained_model as a Triton Inference Server model repository (TensorFlow SavedModel backend).

Layout, as Triton expects it:

    <repository>/<model_name>/config.pbtxt
    <repository>/<model_name>/labels.txt            (class names, for Triton's classification extension)
    <repository>/<model_name>/<version>/model.savedmodel/

`config.pbtxt` is generated from the SavedModel as it was written (its `serving_default` signature: input
and output names, dtypes, shapes), never from what we believe the model looks like, so the names Triton
is told always match the graph it loads.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SAVEDMODEL_DIRNAME = "model.savedmodel"
SIGNATURE_KEY = "serving_default"

_TRITON_DTYPES = {
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "uint8": "TYPE_UINT8",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "bool": "TYPE_BOOL",
    "string": "TYPE_STRING",
}


@dataclass(frozen=True)
class TensorSignature:
    name: str
    dtype: str  # numpy-style name, e.g. float32
    shape: list[int | None]  # including the batch dimension


@dataclass(frozen=True)
class TritonExport:
    repository: Path
    model_dir: Path
    config_text: str
    inputs: list[TensorSignature]
    outputs: list[TensorSignature]


def savedmodel_signature(savedmodel_dir: str | Path, signature_key: str = SIGNATURE_KEY):
    """(inputs, outputs) of a SavedModel signature, read from the loaded SavedModel."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(savedmodel_dir))
    if signature_key not in loaded.signatures:
        raise ValueError(
            f"SavedModel at {savedmodel_dir} has no signature {signature_key!r} (it has {sorted(loaded.signatures)})"
        )
    function = loaded.signatures[signature_key]
    _, input_specs = function.structured_input_signature
    output_specs = function.structured_outputs

    def describe(specs) -> list[TensorSignature]:
        return [TensorSignature(name, spec.dtype.name, list(spec.shape.as_list())) for name, spec in sorted(specs.items())]

    return describe(input_specs), describe(output_specs)


def _tensor_block(tensor: TensorSignature, max_batch_size: int, label_filename: str | None) -> str:
    if tensor.dtype not in _TRITON_DTYPES:
        raise ValueError(f"tensor {tensor.name!r} has dtype {tensor.dtype}, which Triton's TF backend does not take")
    shape = tensor.shape
    if max_batch_size > 0:
        if not shape or shape[0] is not None:
            raise ValueError(
                f"max_batch_size={max_batch_size} needs a variable batch dimension, but "
                f"{tensor.name!r} is shaped {shape}; use max_batch_size 0"
            )
        shape = shape[1:]
    dims = ", ".join(str(-1 if dim is None else dim) for dim in shape)
    lines = [f'    name: "{tensor.name}"', f"    data_type: {_TRITON_DTYPES[tensor.dtype]}", f"    dims: [ {dims} ]"]
    if label_filename:
        lines.append(f'    label_filename: "{label_filename}"')
    return "  {\n" + "\n".join(lines) + "\n  }"


# Triton's TensorFlow backend runs TensorRT at FP32 or FP16 only: the shipped edge format maps to the nearest.
TENSORRT_PRECISION = {"float32": "FP32", "float16": "FP16", "int8": "FP16", "dynamic": "FP16"}


@dataclass(frozen=True)
class ServingDecision:
    """What the repository's clients must know beyond the tensors: the format the edge gate shipped, whose
    precision TensorRT follows on GPU instances, and the decision threshold on P(positive class)."""

    edge_format: str
    threshold: float | None = None
    positive_class: str | None = None

    def blocks(self) -> list[str]:
        parameters = {"edge_format": self.edge_format}
        if self.threshold is not None and self.positive_class is not None:
            parameters |= {"decision_threshold": f"{self.threshold:g}", "positive_class": self.positive_class}
        lines = [f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}' for key, value in parameters.items()]
        precision = TENSORRT_PRECISION[self.edge_format]
        lines.append(
            'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            f'parameters {{ key: "precision_mode" value: "{precision}" }} }} ] }} }}'
        )
        return lines


def triton_config(
    model_name: str,
    inputs: Sequence[TensorSignature],
    outputs: Sequence[TensorSignature],
    max_batch_size: int,
    label_filename: str | None = None,
    decision: ServingDecision | None = None,
) -> str:
    """The text of config.pbtxt for a TensorFlow SavedModel with these signature tensors."""
    if max_batch_size < 0:
        raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
    input_blocks = ",\n".join(_tensor_block(t, max_batch_size, None) for t in inputs)
    # Class labels only make sense on a single [batch, classes] output.
    label_output = label_filename if len(outputs) == 1 else None
    output_blocks = ",\n".join(_tensor_block(t, max_batch_size, label_output) for t in outputs)
    text = [
        f'name: "{model_name}"',
        'platform: "tensorflow_savedmodel"',
        f"max_batch_size: {max_batch_size}",
        f"input [\n{input_blocks}\n]",
        f"output [\n{output_blocks}\n]",
    ]
    if max_batch_size > 0:
        text.append("dynamic_batching { }")  # let Triton gather single requests into batches
    if decision:
        text += decision.blocks()
    return "\n".join(text) + "\n"


def export_triton_repository(
    model,
    repository: str | Path,
    model_name: str,
    *,
    class_names: Sequence[str] = (),
    max_batch_size: int = 8,
    version: int = 1,
    decision: ServingDecision | None = None,
) -> TritonExport:
    """Write `model` (a Keras model) as `<repository>/<model_name>/<version>/model.savedmodel` plus its config."""
    if not model_name or "/" in model_name:
        raise ValueError(f"Triton model name {model_name!r} must be a non-empty folder name")
    if version < 1:
        raise ValueError(f"Triton model versions start at 1, got {version}")
    model_dir = Path(repository) / model_name
    savedmodel_dir = model_dir / str(version) / SAVEDMODEL_DIRNAME
    if savedmodel_dir.exists():
        shutil.rmtree(savedmodel_dir)
    savedmodel_dir.parent.mkdir(parents=True, exist_ok=True)
    model.export(str(savedmodel_dir), format="tf_saved_model", verbose=False)

    inputs, outputs = savedmodel_signature(savedmodel_dir)
    label_filename = None
    if class_names:
        label_filename = "labels.txt"
        (model_dir / label_filename).write_text("".join(f"{name}\n" for name in class_names))
    config_text = triton_config(model_name, inputs, outputs, max_batch_size, label_filename, decision)
    (model_dir / "config.pbtxt").write_text(config_text)
    return TritonExport(Path(repository), model_dir, config_text, inputs, outputs)
