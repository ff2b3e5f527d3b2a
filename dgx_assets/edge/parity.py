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
from pydantic import BaseModel, ConfigDict, Field

from dgx_assets.edge.convert import INPUT_NAME, OUTPUT_NAME, SIGNATURE_KEY
from dgx_assets.gates import SLACK, Criterion, Gate

_EPSILON = SLACK  # floating-point slack for threshold comparisons
CONFIDENT_MARGIN = 0.95  # above every int8 disagreement measured (bench/edge_margins.py); see GateSettings


class GateSettings(BaseModel):
    """When an edge model may replace trained_model: the criteria quantization tools accept a model by.

    Declared once: edge_model's config carries them, its format ladder ships the first format that passes, and
    the blocking `parity` check judges the shipped model with the values recorded beside it.
    """

    model_config = ConfigDict(frozen=True)

    max_accuracy_drop_points: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description="Most the edge model's test accuracy may fall below trained_model's, in points (OpenVINO's "
        "accuracy-aware quantization accepts a 1-point absolute drop; MLPerf 99 % of fp32)",
    )
    max_negative_flip_rate: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Most test images trained_model gets right and the edge model wrong, as a fraction: "
        "accuracy can hold while individual images regress, and these are the regressions users notice",
    )
    confident_margin: float = Field(
        default=CONFIDENT_MARGIN,
        gt=0.0,
        le=1.0,
        description="No disagreement on an image trained_model decides with at least this margin (top-two "
        "probability gap; 2|P - threshold| for two classes). Measured on five ELPV fold models (bench/edge_margins.py): "
        "int8 noise flipped images up to a margin of 0.94, never above 0.95, while pixels normalised twice flipped "
        "550 of 2,624 images above it",
    )


@dataclass(frozen=True)
class ParityReport:
    quantization: str
    images: int
    keras_size_bytes: int
    tflite_size_bytes: int
    size_ratio: float  # tflite / keras
    top1_agreement: float
    disagreements: int
    # Disagreements on images Keras itself barely decides (margin < 0.1): quantisation noise on the decision
    # boundary, as opposed to a broken edge path, which disagrees on confident images too.
    disagreements_near_boundary: int
    max_probability_difference: float
    keras_accuracy: float
    tflite_accuracy: float
    keras_latency_ms: float  # median per image, batch of one
    tflite_latency_ms: float
    latency_ratio: float  # tflite / keras
    latency_images: int
    negative_flips: int = 0  # Keras right, edge wrong
    positive_flips: int = 0  # Keras wrong, edge right
    # Keras' decision margin on each image the two disagree on, largest first: what confident_margin judges.
    disagreement_margins: list[float] = field(default_factory=list)
    threshold: float | None = None  # the decision threshold on P(positive) both were judged at; None: argmax

    @property
    def negative_flip_rate(self) -> float:
        return self.negative_flips / self.images

    def confident_disagreements(self, margin: float) -> int:
        return sum(m >= margin - _EPSILON for m in self.disagreement_margins)

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


def decision_margins(probabilities: np.ndarray, threshold: float | None, positive: int | None) -> np.ndarray:
    """How far each image is from the decision boundary: the top-two probability gap, or 2|P(positive) - t|
    with a threshold t (the same number when t = 0.5)."""
    if threshold is not None and positive is not None:
        return 2.0 * np.abs(probabilities[:, positive] - threshold)
    top_two = np.sort(probabilities, axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


def compare(
    keras: Predictions,
    edge: Predictions,
    labels: np.ndarray,
    *,
    quantization: str,
    keras_size_bytes: int,
    tflite_size_bytes: int,
    threshold: float | None = None,
    positive: int | None = None,
) -> ParityReport:
    """The parity figures from two sets of predictions on the same images (same order), both decided by the
    same rule (argmax, or `threshold` on class `positive`)."""
    from dgx_assets.training.decision import decide

    labels = np.asarray(labels)
    if not (len(labels) == len(keras.probabilities) == len(edge.probabilities)):
        raise ValueError(
            f"{len(labels)} labels, {len(keras.probabilities)} Keras and "
            f"{len(edge.probabilities)} TFLite predictions: they must cover the same images"
        )
    if len(labels) == 0:
        raise ValueError("no test images to compare on")
    keras_top1 = decide(keras.probabilities, threshold, positive)
    edge_top1 = decide(edge.probabilities, threshold, positive)
    margins = decision_margins(keras.probabilities, threshold, positive)
    differ = keras_top1 != edge_top1
    timed = len(keras.latencies_s)
    keras_ms = float(np.median(keras.latencies_s) * 1000) if timed else float("nan")
    edge_ms = float(np.median(edge.latencies_s[:timed]) * 1000) if timed else float("nan")
    return ParityReport(
        quantization=quantization,
        images=len(labels),
        keras_size_bytes=keras_size_bytes,
        tflite_size_bytes=tflite_size_bytes,
        size_ratio=tflite_size_bytes / keras_size_bytes,
        top1_agreement=float(np.mean(~differ)),
        disagreements=int(np.sum(differ)),
        disagreements_near_boundary=int(np.sum(differ & (margins < 0.1))),
        max_probability_difference=float(np.max(np.abs(keras.probabilities - edge.probabilities))),
        keras_accuracy=float(np.mean(keras_top1 == labels)),
        tflite_accuracy=float(np.mean(edge_top1 == labels)),
        keras_latency_ms=keras_ms,
        tflite_latency_ms=edge_ms,
        latency_ratio=edge_ms / keras_ms if timed else float("nan"),
        latency_images=timed,
        negative_flips=int(np.sum((keras_top1 == labels) & (edge_top1 != labels))),
        positive_flips=int(np.sum((keras_top1 != labels) & (edge_top1 == labels))),
        disagreement_margins=sorted((round(float(m), 6) for m in margins[differ]), reverse=True),
        threshold=threshold,
    )


def evaluate_gate(report: ParityReport, settings: GateSettings | None = None) -> Gate:
    """The three criteria of `settings` on one parity report; passes when all hold."""
    settings = settings or GateSettings()
    drop = (report.keras_accuracy - report.tflite_accuracy) * 100
    confident = report.confident_disagreements(settings.confident_margin)
    criteria = [
        Criterion(
            "accuracy_drop_points",
            round(drop, 4),
            settings.max_accuracy_drop_points,
            drop <= settings.max_accuracy_drop_points + _EPSILON,
            "max",
            f"edge accuracy {report.tflite_accuracy:.2%} is {abs(drop):.2f} points {'below' if drop > 0 else 'above'} "
            f"trained_model's {report.keras_accuracy:.2%} (most allowed drop: {settings.max_accuracy_drop_points:g})",
        ),
        Criterion(
            "negative_flip_rate",
            round(report.negative_flip_rate, 6),
            settings.max_negative_flip_rate,
            report.negative_flip_rate <= settings.max_negative_flip_rate + _EPSILON,
            "max",
            f"{report.negative_flips} of {report.images} test images ({report.negative_flip_rate:.2%}) are right with "
            f"trained_model and wrong with the edge model (most allowed: {settings.max_negative_flip_rate:.2%})",
        ),
        Criterion(
            "confident_disagreements",
            confident,
            0,
            confident == 0,
            "max",
            f"{confident} disagreements on images trained_model decides with a margin of at least "
            f"{settings.confident_margin:g} (allowed: none; {report.disagreements} disagreements in all, "
            f"the largest margin {max(report.disagreement_margins, default=0.0):.3f})",
        ),
    ]
    return Gate.of("parity", criteria, settings=settings.model_dump())


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
