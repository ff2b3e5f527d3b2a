"""The format ladder: which TFLite format edge devices get.

`quantization: auto` converts to full-integer int8 first (smallest, fastest, what int8-only NPUs run) and
judges it with the parity gate; when int8 fails it tries float16, then float32, and ships the first format
that passes. A forced format (`int8`, `float16`, `float32`, `dynamic`) is the only one tried and ships
whether or not it passes; the blocking check then holds the champion back with the figures.

Plain Python: edge_model and the cross-validation benchmark both call `run_ladder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dgx_assets.edge import convert, parity
from dgx_assets.gates import Gate
from dgx_assets.training.decision import Decision

LADDER = ("int8", "float16", "float32")


def formats_to_try(quantization: str) -> tuple[str, ...]:
    return LADDER if quantization == convert.AUTO else (quantization,)


@dataclass(frozen=True)
class EdgeInputs:
    """The images the ladder converts and judges with: calibration at the raw size, test images both ways."""

    raw_size: tuple[int, int]
    representative: list[np.ndarray]
    test_raw: np.ndarray  # what a device feeds: decoded uint8 at the raw size
    test_features: np.ndarray  # what trained_model was evaluated on
    test_labels: np.ndarray


@dataclass
class FormatTrial:
    format: str
    report: parity.ParityReport
    gate: Gate
    spec: convert.EdgeModelSpec
    tflite_model: bytes = field(repr=False)
    predictions: parity.Predictions = field(repr=False)

    def summary(self) -> dict:
        """One row of the ladder, as metadata, MLflow and the report show it."""
        r = self.report
        return {
            "format": self.format,
            "error": None,
            "size_ratio": r.size_ratio,
            "latency_ratio": r.latency_ratio,
            "accuracy": r.tflite_accuracy,
            "keras_accuracy": r.keras_accuracy,
            "agreement": r.top1_agreement,
            "negative_flips": r.negative_flips,
            "negative_flip_rate": r.negative_flip_rate,
            "confident_disagreements": self.gate.criteria[2].value,
            "images": r.images,
            "passed": self.gate.passed,
            "failed_criteria": self.gate.reasons,
        }


@dataclass
class BrokenTrial:
    """A format whose conversion or runtime failed outright (LiteRT refusing to prepare the model, say)."""

    format: str
    error: str

    def summary(self) -> dict:
        return {"format": self.format, "error": self.error, "passed": False, "failed_criteria": [self.error]}


@dataclass
class LadderOutcome:
    requested: str  # the `quantization` setting: auto, or the one format forced
    trials: list[FormatTrial | BrokenTrial]
    shipped: FormatTrial
    reason: str  # why this format, in a sentence
    keras: parity.Predictions = field(repr=False)

    def summary(self) -> dict:
        shipped = self.shipped.report
        return {
            "requested": self.requested,
            "format": self.shipped.format,
            "passed": self.shipped.gate.passed,
            "reason": self.reason,
            "images": shipped.images,
            "edge_correct": round(shipped.tflite_accuracy * shipped.images),
            "trials": [trial.summary() for trial in self.trials],
        }


def run_ladder(
    model,
    *,
    keras_size_bytes: int,
    class_names: Sequence[str],
    inputs: EdgeInputs,
    conversion: convert.ConversionSettings,
    gate: parity.GateSettings,
    decision: Decision = Decision(),
    latency_images: int = 100,
    num_threads: int | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> LadderOutcome:
    """Convert, measure and judge each format of `conversion.quantization` in turn; stop at the first pass."""
    keras = parity.keras_predict(model, inputs.test_features, latency_images=min(latency_images, len(inputs.test_features)))
    formats = formats_to_try(conversion.quantization)
    trials: list[FormatTrial | BrokenTrial] = []
    for quantization in formats:
        try:
            trial = _try_format(
                quantization, model, keras, keras_size_bytes, class_names, inputs, conversion, gate, decision, num_threads
            )
        except (ValueError, RuntimeError) as error:  # LiteRT refusing a model, a converter error: this format is out
            if quantization == formats[-1]:
                raise ValueError(f"the {quantization} edge model cannot be built or run: {error}") from error
            broken = BrokenTrial(quantization, f"{type(error).__name__}: {error}"[:500])
            trials.append(broken)
            log(f"{quantization}: {broken.error}")
            continue
        trials.append(trial)
        verdict = "passes" if trial.gate.passed else "fails: " + "; ".join(trial.gate.reasons)
        figures = f"agreement {trial.report.top1_agreement:.2%}, accuracy {trial.report.tflite_accuracy:.2%}"
        log(f"{quantization}: {figures}, gate {verdict}")
        if trial.gate.passed:
            break
    built = [trial for trial in trials if isinstance(trial, FormatTrial)]
    shipped = next((trial for trial in built if trial.gate.passed), built[-1])
    return LadderOutcome(conversion.quantization, trials, shipped, _reason(conversion.quantization, trials, shipped), keras)


def _try_format(
    quantization: str,
    model,
    keras: parity.Predictions,
    keras_size_bytes: int,
    class_names: Sequence[str],
    inputs: EdgeInputs,
    conversion: convert.ConversionSettings,
    gate: parity.GateSettings,
    decision: Decision,
    num_threads: int | None,
) -> FormatTrial:
    config = convert.EdgeConversionConfig(
        **{**conversion.model_dump(), "quantization": quantization}, raw_height=inputs.raw_size[0], raw_width=inputs.raw_size[1]
    )
    tflite_model = convert.convert_to_tflite(model, config, inputs.representative)
    spec = convert.describe_tflite(tflite_model, class_names, config, convert.model_input_shape(model))
    edge = parity.tflite_predict(tflite_model, inputs.test_raw, num_threads=num_threads)
    report = parity.compare(
        keras,
        edge,
        inputs.test_labels,
        quantization=quantization,
        keras_size_bytes=keras_size_bytes,
        tflite_size_bytes=len(tflite_model),
        threshold=decision.threshold,
        positive=decision.positive_index,
    )
    return FormatTrial(quantization, report, parity.evaluate_gate(report, gate), spec, tflite_model, edge)


def _reason(quantization: str, trials: list[FormatTrial | BrokenTrial], shipped: FormatTrial) -> str:
    failed = [
        f"{t.format} failed it ({t.error if isinstance(t, BrokenTrial) else '; '.join(t.gate.reasons)})"
        for t in trials
        if isinstance(t, BrokenTrial) or not t.gate.passed
    ]
    if quantization != convert.AUTO:
        outcome = "passes the parity gate" if shipped.gate.passed else "fails the parity gate: " + "; ".join(shipped.gate.reasons)
        return f"{shipped.format}, forced by `quantization: {quantization}`; it {outcome}"
    if not shipped.gate.passed:
        return (
            f"no format of the ladder ({', '.join(LADDER)}) passed the parity gate: {'; '.join(failed)}; shipped {shipped.format}"
        )
    if not failed:
        return f"{shipped.format}, the first format of the ladder ({', '.join(LADDER)}), passed the parity gate"
    return f"{shipped.format}, the first format to pass the parity gate: {'; '.join(failed)}"
