"""Does the edge model behave like the model it came from? Measure it, then gate on it.

The TFLite model runs in `ai_edge_litert` (the maintained runtime; `tf.lite.Interpreter` is deprecated)
on the decoded test images at the edge raw size, exactly as a device feeds it. The Keras model runs on the
model-input tensors trained_model was evaluated on (image_features). Agreement therefore covers the whole
edge path: on-device resize, normalisation and quantisation.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from dgx_assets.edge.convert import INPUT_NAME, OUTPUT_NAME, SIGNATURE_KEY

# Floating-point slack for threshold comparisons (1 image in 10**9).
_EPSILON = 1e-9


@dataclass(frozen=True)
class ParityReport:
    quantization: str
    images: int
    keras_size_bytes: int
    tflite_size_bytes: int
    size_ratio: float  # tflite / keras
    top1_agreement: float
    disagreements: int
    # Disagreements on images Keras itself barely decides (top-two margin < 0.1): quantisation noise on
    # the decision boundary, as opposed to a broken edge path, which disagrees on confident images too.
    disagreements_near_boundary: int
    max_probability_difference: float
    keras_accuracy: float
    tflite_accuracy: float
    keras_latency_ms: float  # median per image, batch of one
    tflite_latency_ms: float
    latency_ratio: float  # tflite / keras
    latency_images: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GateResult:
    passed: bool
    min_agreement: float
    max_accuracy_drop: float  # as a fraction: 0.01 is one accuracy point
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Predictions:
    probabilities: np.ndarray  # [n, classes]
    latencies_s: np.ndarray  # per timed image


def tflite_predict(tflite_model: bytes, raw_images: np.ndarray, num_threads: int | None = None) -> Predictions:
    """Run every raw uint8 image through the edge model, one at a time, timing each invoke."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=tflite_model, num_threads=num_threads)
    runner = interpreter.get_signature_runner(SIGNATURE_KEY)
    expected = tuple(runner.get_input_details()[INPUT_NAME]["shape"][1:])
    if raw_images.ndim != 4 or tuple(raw_images.shape[1:]) != expected:
        raise ValueError(f"raw images shaped {raw_images.shape}, the edge model takes [n, {', '.join(map(str, expected))}]")
    raw_images = np.ascontiguousarray(raw_images, dtype=np.uint8)
    runner(**{INPUT_NAME: raw_images[:1]})  # warm-up: first invoke allocates and plans
    probabilities, latencies = [], []
    for image in raw_images:
        started = time.perf_counter()
        result = runner(**{INPUT_NAME: image[np.newaxis]})
        latencies.append(time.perf_counter() - started)
        probabilities.append(result[OUTPUT_NAME][0])
    return Predictions(np.asarray(probabilities, dtype=np.float32), np.asarray(latencies))


def keras_predict(model, inputs: np.ndarray, latency_images: int) -> Predictions:
    """Batch predictions for all inputs, plus per-image latency (batch of one, compiled) on the first few."""
    import tensorflow as tf

    inputs = np.asarray(inputs, dtype=np.float32)
    probabilities = np.asarray(model.predict(inputs, batch_size=64, verbose=0), dtype=np.float32)
    # A compiled single-image call is what a Keras server does per request; eager calls would flatter TFLite.
    single = tf.function(lambda x: model(x, training=False), input_signature=[tf.TensorSpec([1, *inputs.shape[1:]], tf.float32)])
    single(inputs[:1])
    latencies = []
    for image in inputs[:latency_images]:
        started = time.perf_counter()
        single(image[np.newaxis]).numpy()
        latencies.append(time.perf_counter() - started)
    return Predictions(probabilities, np.asarray(latencies))


def compare(
    keras: Predictions,
    edge: Predictions,
    labels: np.ndarray,
    *,
    quantization: str,
    keras_size_bytes: int,
    tflite_size_bytes: int,
) -> ParityReport:
    """The parity figures from two sets of predictions on the same images (same order)."""
    labels = np.asarray(labels)
    if not (len(labels) == len(keras.probabilities) == len(edge.probabilities)):
        raise ValueError(
            f"{len(labels)} labels, {len(keras.probabilities)} Keras and "
            f"{len(edge.probabilities)} TFLite predictions: they must cover the same images"
        )
    if len(labels) == 0:
        raise ValueError("no test images to compare on")
    keras_top1 = keras.probabilities.argmax(axis=1)
    edge_top1 = edge.probabilities.argmax(axis=1)
    top_two = np.sort(keras.probabilities, axis=1)[:, -2:]
    near_boundary = (top_two[:, 1] - top_two[:, 0]) < 0.1
    timed = len(keras.latencies_s)
    keras_ms = float(np.median(keras.latencies_s) * 1000) if timed else float("nan")
    edge_ms = float(np.median(edge.latencies_s[:timed]) * 1000) if timed else float("nan")
    return ParityReport(
        quantization=quantization,
        images=len(labels),
        keras_size_bytes=keras_size_bytes,
        tflite_size_bytes=tflite_size_bytes,
        size_ratio=tflite_size_bytes / keras_size_bytes,
        top1_agreement=float(np.mean(keras_top1 == edge_top1)),
        disagreements=int(np.sum(keras_top1 != edge_top1)),
        disagreements_near_boundary=int(np.sum((keras_top1 != edge_top1) & near_boundary)),
        max_probability_difference=float(np.max(np.abs(keras.probabilities - edge.probabilities))),
        keras_accuracy=float(np.mean(keras_top1 == labels)),
        tflite_accuracy=float(np.mean(edge_top1 == labels)),
        keras_latency_ms=keras_ms,
        tflite_latency_ms=edge_ms,
        latency_ratio=edge_ms / keras_ms if timed else float("nan"),
        latency_images=timed,
    )


def measure_parity(
    tflite_model: bytes,
    keras_model,
    *,
    raw_images: np.ndarray,
    keras_inputs: np.ndarray,
    labels: np.ndarray,
    keras_size_bytes: int,
    quantization: str,
    latency_images: int = 100,
    num_threads: int | None = None,
) -> tuple[ParityReport, Predictions, Predictions]:
    """Run both models on the same test images; the report plus both predictions (for figures)."""
    if len(raw_images) != len(keras_inputs):
        raise ValueError(f"{len(raw_images)} raw images but {len(keras_inputs)} Keras inputs")
    edge = tflite_predict(tflite_model, raw_images, num_threads=num_threads)
    keras = keras_predict(keras_model, keras_inputs, latency_images=min(latency_images, len(keras_inputs)))
    report = compare(
        keras, edge, labels, quantization=quantization, keras_size_bytes=keras_size_bytes, tflite_size_bytes=len(tflite_model)
    )
    return report, keras, edge


def evaluate_gate(report: ParityReport, min_agreement: float = 0.99, max_accuracy_drop: float = 0.01) -> GateResult:
    """Pass when top-1 agreement >= min_agreement and TFLite accuracy >= Keras accuracy - max_accuracy_drop."""
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement must be a fraction in [0, 1], got {min_agreement}")
    if max_accuracy_drop < 0:
        raise ValueError(f"max_accuracy_drop must be >= 0, got {max_accuracy_drop}")
    reasons = []
    if report.top1_agreement + _EPSILON < min_agreement:
        reasons.append(
            f"top-1 agreement {report.top1_agreement:.2%} is below {min_agreement:.2%} "
            f"({report.disagreements} of {report.images} test images disagree)"
        )
    drop = report.keras_accuracy - report.tflite_accuracy
    if drop > max_accuracy_drop + _EPSILON:
        reasons.append(
            f"TFLite accuracy {report.tflite_accuracy:.2%} is {drop * 100:.2f} points below Keras "
            f"{report.keras_accuracy:.2%} (allowed: {max_accuracy_drop * 100:.2f})"
        )
    return GateResult(passed=not reasons, min_agreement=min_agreement, max_accuracy_drop=max_accuracy_drop, reasons=reasons)


def parity_figure(keras: Predictions, edge: Predictions, class_names: Sequence[str]) -> bytes:
    """PNG: per-class probabilities Keras vs TFLite, and per-image latency distributions."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.2))
    scatter, latency = figure.subplots(1, 2)
    for index, name in enumerate(class_names):
        scatter.scatter(keras.probabilities[:, index], edge.probabilities[:, index], s=10, alpha=0.6, label=name)
    scatter.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
    scatter.set(
        xlabel="Keras probability", ylabel="TFLite probability", title="Probabilities, test images", xlim=(0, 1), ylim=(0, 1)
    )
    scatter.legend(loc="upper left", fontsize=8)
    timed = len(keras.latencies_s)
    latency.boxplot([keras.latencies_s * 1000, edge.latencies_s[:timed] * 1000], tick_labels=["Keras", "TFLite"])
    latency.set(ylabel="ms per image (batch 1, CPU)", title=f"Latency on the same {timed} images")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()
