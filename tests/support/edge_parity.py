"""Both models on the same test images in one call, as the edge tests and bench/edge.py measure parity (the
edge_model asset's ladder runs the steps itself: `dgx_assets/edge/ladder.py`)."""

from __future__ import annotations

import numpy as np

from dgx_assets.edge.parity import ParityReport, Predictions, compare, keras_predict, tflite_predict


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
