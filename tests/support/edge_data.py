"""A small real classifier for the edge tests: PNG solar-cell-like images, briefly trained in the session.

Images are 48x48 grey PNGs (the edge raw size); the network takes 24x24, so the edge model really resizes.
`defective` cells carry a dark crack line, `functional` ones only sensor noise and a brightness gradient.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

RAW_SIZE = 48
MODEL_SIZE = 24
CLASS_NAMES = ["functional", "defective"]


def cell_image(defective: bool, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:RAW_SIZE, 0:RAW_SIZE]
    pixels = rng.uniform(110, 170) + rng.uniform(-0.6, 0.6) * x + rng.normal(0, 10, (RAW_SIZE, RAW_SIZE))
    if defective:
        # A crack: a dark line at a random angle through a random point, 2-3 px wide.
        angle = rng.uniform(0, np.pi)
        cy, cx = rng.uniform(12, 36, size=2)
        distance = np.abs((x - cx) * np.sin(angle) - (y - cy) * np.cos(angle))
        pixels = np.where(distance < rng.uniform(1.0, 1.6), rng.uniform(15, 45), pixels)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class EdgeDataset:
    contents: list[bytes]
    labels: list[str]
    splits: list[str]

    def select(self, split: str) -> tuple[list[bytes], list[str]]:
        chosen = [i for i, s in enumerate(self.splits) if s == split]
        return [self.contents[i] for i in chosen], [self.labels[i] for i in chosen]


def features_like_image_features(contents: list[bytes]) -> np.ndarray:
    """What image_features stores: TensorFlow decode + antialiased bilinear resize to the model size, as uint8."""
    import tensorflow as tf

    tensors = []
    for content in contents:
        image = tf.io.decode_png(content, channels=1)
        resized = tf.image.resize(image, (MODEL_SIZE, MODEL_SIZE), method="bilinear", antialias=True)
        tensors.append(tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8).numpy())
    return np.stack(tensors)


@pytest.fixture(scope="session")
def edge_dataset() -> EdgeDataset:
    rng = np.random.default_rng(7)
    contents, labels, splits = [], [], []
    for split, count in (("train", 240), ("validation", 20), ("test", 100)):
        for index in range(count):
            defective = index % 2 == 1
            contents.append(png_bytes(cell_image(defective, rng)))
            labels.append(CLASS_NAMES[int(defective)])
            splits.append(split)
    return EdgeDataset(contents, labels, splits)


@dataclass
class TrainedClassifier:
    model: object
    path: Path
    class_names: list[str]


@pytest.fixture(scope="session")
def trained_classifier(edge_dataset, tmp_path_factory) -> TrainedClassifier:
    """A tiny CNN trained for a few seconds; input float 0..255 [None, 24, 24, 1], rescaling inside."""
    import keras

    keras.utils.set_random_seed(0)
    contents, labels = edge_dataset.select("train")
    x = features_like_image_features(contents).astype("float32")
    y = np.array([CLASS_NAMES.index(label) for label in labels])
    inputs = keras.Input((MODEL_SIZE, MODEL_SIZE, 1), name="pixels")
    hidden = keras.layers.Rescaling(1 / 255.0)(inputs)
    hidden = keras.layers.Conv2D(8, 3, activation="relu")(hidden)
    hidden = keras.layers.Conv2D(8, 3, activation="relu")(hidden)
    hidden = keras.layers.GlobalMaxPooling2D()(hidden)
    outputs = keras.layers.Dense(len(CLASS_NAMES), activation="softmax", name="probabilities")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=25, batch_size=32, verbose=0)
    path = tmp_path_factory.mktemp("trained") / "model.keras"
    model.save(path)
    return TrainedClassifier(model, path, list(CLASS_NAMES))


@dataclass
class EdgeInputs:
    raw_images: np.ndarray  # uint8 [n, RAW, RAW, 1], as the device decodes them
    keras_inputs: np.ndarray  # uint8 [n, MODEL, MODEL, 1], as image_features stores them
    labels: np.ndarray  # class indices


def edge_inputs(dataset: EdgeDataset, split: str) -> EdgeInputs:
    from dgx_assets.edge.convert import decode_to_raw

    contents, labels = dataset.select(split)
    raw = np.stack([decode_to_raw(content, RAW_SIZE, RAW_SIZE, 1) for content in contents])
    return EdgeInputs(raw, features_like_image_features(contents), np.array([CLASS_NAMES.index(label) for label in labels]))


@pytest.fixture(scope="session")
def test_inputs(edge_dataset) -> EdgeInputs:
    return edge_inputs(edge_dataset, "test")


@pytest.fixture(scope="session")
def train_raw_images(edge_dataset) -> list[np.ndarray]:
    return list(edge_inputs(edge_dataset, "train").raw_images)


@pytest.fixture(scope="session")
def edge_model_dir(trained_classifier, train_raw_images, tmp_path_factory) -> Path:
    """What edge_model writes: model.tflite (a real int8 model) carrying its contract, and edge_model.json."""
    import json

    from dgx_assets.edge.convert import EdgeConversionConfig, convert_to_tflite, describe_tflite
    from dgx_assets.station.runtime import CONTRACT_FILE, MODEL_FILE
    from dgx_assets.station.tflite_metadata import embed_contract

    config = EdgeConversionConfig(raw_height=RAW_SIZE, raw_width=RAW_SIZE, representative_samples=100)
    tflite = convert_to_tflite(trained_classifier.model, config, train_raw_images)
    spec = describe_tflite(tflite, CLASS_NAMES, config, (MODEL_SIZE, MODEL_SIZE, 1))
    folder = tmp_path_factory.mktemp("edge_model")
    contract = {**spec.to_dict(), "format": "int8", "raw_height": RAW_SIZE, "raw_width": RAW_SIZE}
    (folder / MODEL_FILE).write_bytes(embed_contract(tflite, contract))
    (folder / CONTRACT_FILE).write_text(json.dumps(contract))
    return folder


@dataclass
class RegisteredVersion:
    tracking_uri: str
    model_name: str
    version: str
    run_id: str


@pytest.fixture
def registered_version(tmp_path, monkeypatch) -> RegisteredVersion:
    """A real MLflow sqlite store holding one training run and model version 1 (alias `candidate`)."""
    from mlflow import MlflowClient

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # nothing may fall back to ./mlflow.db
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = client.create_experiment("edge-tests", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment_id)
    client.log_metric(run.info.run_id, "test_accuracy", 0.97)
    client.set_terminated(run.info.run_id)
    name = "edge_test_classifier"
    client.create_registered_model(name)
    version = client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    client.set_registered_model_alias(name, "candidate", version.version)
    return RegisteredVersion(tracking_uri, name, str(version.version), run.info.run_id)
