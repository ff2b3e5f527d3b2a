"""A batch's images scored by the registry's `champion` version, on Spark executors.

The version is looked up by alias when the run starts, so a promotion changes what the next run scores with and
no code changes. Its Keras file travels to the executors once, as a broadcast; each Python worker loads it once
(cached by content hash) and binds to the GPU Spark gave its task before TensorFlow's first import. The inputs are
image_features' stored tensors, the ones the model was trained and tested on, and the decision (its views are in
the model's graph, the threshold on P(positive) is what trained_model recorded with the version) is
`training.decision`'s, so a score here is the score trained_model's own evaluation gives the same image.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dgx_assets.tracking.registry import CHAMPION_ALIAS
from dgx_assets.training.decision import Decision, decide, positive_index
from dgx_assets.training.features import tensor_from_row, traced_forward

PREDICTIONS_TABLE = "defect_predictions"
PREDICTIONS_SCHEMA = pa.schema(
    [
        ("sha256", pa.string()),
        ("path", pa.string()),
        ("batch", pa.string()),
        ("label", pa.string()),
        ("defect_probability", pa.float64()),
        ("predicted_label", pa.string()),
        ("threshold", pa.float64()),
        ("model_name", pa.string()),
        ("model_version", pa.string()),
        ("scored_at", pa.timestamp("us", tz="UTC")),
    ]
)
PREDICTIONS_COLUMNS = {
    "sha256": "content hash of the image (raw_images' and image_features' id)",
    "path": "the file in the landing zone, as raw_images holds it",
    "batch": "the landing batch (the table's partition)",
    "label": "the inspector's class when the image came in a label folder; null for a production image",
    "defect_probability": "the champion's P(positive class), averaged over the views it was trained to average",
    "predicted_label": "the class the champion's decision gives (threshold on defect_probability, else argmax)",
    "threshold": "the decision threshold recorded with the version (null: argmax)",
    "model_name": "the registered model",
    "model_version": "the version behind the alias `champion` when the batch was scored",
    "scored_at": "when the scoring run started (UTC)",
}
FEATURE_COLUMNS = ["sha256", "path", "batch", "label", "tensor", "tensor_shape", "feature_status"]
MODEL_ARTIFACT = "data/model.keras"  # where mlflow.tensorflow keeps a Keras model inside a logged model
PREDICT_ROWS = 32  # images per model call: the tensors of one call stay a few MB


@dataclasses.dataclass(frozen=True)
class Champion:
    """The version behind the alias `champion`, and how its probabilities become classes."""

    model_name: str
    version: str
    run_id: str
    class_names: tuple[str, ...]
    decision: Decision
    training_table: str | None = None  # the image_features snapshot it was trained on (drift's reference)
    training_snapshot_id: int | None = None

    @property
    def positive(self) -> int | None:
        return positive_index(self.class_names)

    @property
    def positive_class(self) -> str | None:
        """The class defect_probability is the probability of (None for more than two classes)."""
        return self.class_names[self.positive] if self.positive is not None else None

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"


def find_champion(tracking_uri: str, model_name: str) -> Champion | None:
    """The version holding `champion` now, with the class names and decision its training run recorded; None
    when no version holds it (or the model is not registered)."""
    from mlflow.tracking import MlflowClient

    from dgx_assets.tracking.registry import current_alias_version

    version = current_alias_version(MlflowClient(tracking_uri), model_name, CHAMPION_ALIAS)
    return None if version is None else registered_version(tracking_uri, model_name, version)


def registered_version(tracking_uri: str, model_name: str, version: str) -> Champion:
    """A registered version as a Champion: what its training run recorded (classes, decision, the data it read)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(model_name, version).run_id
    if run_id is None:
        raise ValueError(f"{model_name} v{version} has no training run: it was not registered by trained_model")
    tags = client.get_run(run_id).data.tags
    snapshot = tags.get("dgx.snapshot_id")
    return Champion(
        model_name=model_name,
        version=version,
        run_id=run_id,
        class_names=tuple(json.loads(tags["dgx.class_names"])),
        decision=Decision.from_dict(json.loads(tags.get("dgx.decision", "{}"))),
        training_table=tags.get("dgx.table"),
        training_snapshot_id=int(snapshot) if snapshot else None,
    )


def download_model(tracking_uri: str, champion: Champion) -> bytes:
    """The version's Keras file, as bytes (what the executors get)."""
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    # MLflow 3.17 resolves a models:/ URI in the process-wide registry, whatever registry_uri says: the
    # version's artifact location is looked up here, in the store asked about.
    location = MlflowClient(tracking_uri).get_model_version_download_uri(champion.model_name, champion.version)
    with tempfile.TemporaryDirectory(prefix="champion-") as folder:
        local = download_artifacts(artifact_uri=location, dst_path=folder, tracking_uri=tracking_uri)
        path = Path(local) / MODEL_ARTIFACT
        if not path.is_file():
            raise FileNotFoundError(f"{champion.model_uri} has no {MODEL_ARTIFACT}: it was not logged by trained_model")
        return path.read_bytes()


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A version's Keras model in a worker, with its inference call traced once."""

    keras: Any
    forward: Any  # traced_forward(keras)

    @classmethod
    def of(cls, keras_model: Any) -> LoadedModel:
        return cls(keras_model, traced_forward(keras_model))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.keras.input_shape[1:])


def probabilities(model: LoadedModel, tensors: np.ndarray) -> np.ndarray:
    """Class probabilities of uint8 (n, height, width, channels) model inputs, PREDICT_ROWS images per call."""
    parts = [
        np.asarray(model.forward(tensors[start : start + PREDICT_ROWS].astype(np.float32)))
        for start in range(0, len(tensors), PREDICT_ROWS)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def prediction_columns(champion: Champion, probs: np.ndarray) -> dict[str, list]:
    """defect_probability, predicted_label and threshold of each row of `probs`, by the champion's decision."""
    positive, threshold = champion.positive, champion.decision.threshold
    chosen = decide(probs, threshold, positive) if len(probs) else np.zeros(0, dtype=int)
    return {
        "defect_probability": [float(p) for p in probs[:, positive]] if positive is not None else [None] * len(probs),
        "predicted_label": [champion.class_names[i] for i in chosen],
        "threshold": [threshold] * len(probs),
    }


@dataclasses.dataclass(frozen=True)
class ScoringJob:
    """What each task needs besides its row groups: the model (a broadcast of its bytes) and the stamp."""

    model: Any  # pyspark Broadcast[bytes]
    model_sha256: str
    champion: Champion
    scored_at: dt.datetime


def score_batch(spark: Any, features: Any, champion: Champion, model_bytes: bytes, output_uri: str, writer: str) -> list[str]:
    """Spark job: every usable image_features row of the snapshot `features` (one batch's) scored, written as
    Parquet files of PREDICTIONS_SCHEMA into the new folder `output_uri`; returns the files, for the commit."""
    import functools

    from dgx_assets.spark.chunks import map_chunks, pack
    from dgx_assets.spark.table_writer import write_table_files

    groups = _row_groups(features)
    if not groups:
        return []
    broadcast = spark.sparkContext.broadcast(model_bytes)
    job = ScoringJob(broadcast, hashlib.sha256(model_bytes).hexdigest(), champion, dt.datetime.now(dt.UTC))
    try:
        chunks = pack(groups, lambda group: group[2], 64 * 1024**2, 2 * spark.sparkContext.defaultParallelism)
        frame = map_chunks(spark, chunks, functools.partial(score_row_groups, job=job), PREDICTIONS_SCHEMA)
        return write_table_files(frame, output_uri, PREDICTIONS_SCHEMA, writer=writer)
    finally:
        broadcast.destroy()


def _row_groups(features: Any) -> list[tuple[str, int, int]]:
    """(file URI, row group, bytes) of a TableSnapshot's files, from their footers."""
    import pyarrow.parquet as pq

    groups = []
    for uri, path in zip(features.uris, features.paths):
        with features.filesystem.open_input_file(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
        groups += [(uri, index, metadata.row_group(index).total_byte_size) for index in range(metadata.num_row_groups)]
    return groups


def score_row_groups(groups: list[tuple[str, int, int]], job: ScoringJob) -> Iterator[pa.RecordBatch]:
    """Task body, in a Spark Python worker: bind to the task's GPU, load the model once, score each row group's
    usable rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dgx_assets.lake.files import path_of, worker_filesystem
    from dgx_assets.spark.gpu import bind_task_gpus

    binding = bind_task_gpus()
    binding.tensorflow()
    model = _worker_model(job)
    for uri, index, _ in groups:
        with worker_filesystem(uri).open_input_file(path_of(uri)) as handle:
            rows = pq.ParquetFile(handle).read_row_group(index, columns=FEATURE_COLUMNS)
        rows = rows.filter(pc.equal(rows.column("feature_status"), "ok"))  # pyright: ignore[reportAttributeAccessIssue]
        if rows.num_rows:
            yield scored_rows(model, rows, job.champion, job.scored_at)


def scored_rows(model: LoadedModel, rows: pa.Table, champion: Champion, scored_at: dt.datetime) -> pa.RecordBatch:
    """PREDICTIONS_SCHEMA rows for image_features rows (FEATURE_COLUMNS)."""
    shapes = {tuple(shape) for shape in rows.column("tensor_shape").to_pylist()}
    if len(shapes) != 1:
        raise ValueError(f"image_features rows of different tensor shapes {sorted(shapes)} in one row group")
    shape = shapes.pop()
    expected = model.input_shape
    if shape != expected:
        raise ValueError(
            f"image_features tensors are {list(shape)}, the champion v{champion.version} takes {list(expected)}: "
            "re-materialize image_features with the champion's image size and channels"
        )
    tensors = np.stack([tensor_from_row(blob, shape) for blob in rows.column("tensor").to_pylist()])
    count = rows.num_rows
    columns = {name: rows.column(name).combine_chunks() for name in ("sha256", "path", "batch", "label")}
    return pa.RecordBatch.from_pydict(
        columns
        | prediction_columns(champion, probabilities(model, tensors))
        | {
            "model_name": [champion.model_name] * count,
            "model_version": [champion.version] * count,
            "scored_at": [scored_at] * count,
        },
        schema=PREDICTIONS_SCHEMA,
    )


_MODELS: dict[str, LoadedModel] = {}
_MODELS_LOCK = threading.Lock()


def _worker_model(job: ScoringJob) -> LoadedModel:
    """The Keras model of the job's bytes, loaded and traced once per Python worker (Spark reuses workers across
    tasks)."""
    from dgx_assets.training.model import model_from_bytes

    with _MODELS_LOCK:
        if job.model_sha256 not in _MODELS:
            _MODELS.clear()  # one champion at a time: an older version's weights are not kept alive
            _MODELS[job.model_sha256] = LoadedModel.of(model_from_bytes(job.model.value, compile=False))
        return _MODELS[job.model_sha256]
