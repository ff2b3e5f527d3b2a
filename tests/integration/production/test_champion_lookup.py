"""The champion looked up and fetched from the store it is asked about, not from MLflow's process-wide one: a real
sqlite registry holding a logged Keras model, while the process points MLflow somewhere else."""

import json

import mlflow
import mlflow.tensorflow
import numpy as np
import pytest
from mlflow import MlflowClient

from dgx_assets.production.scoring import download_model, find_champion
from dgx_assets.training.model import model_from_bytes

NAME = "lookup_test_model"


def tiny_classifier():
    import keras

    pixels = keras.Input((8, 8, 1), name="pixels")
    hidden = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(2, 3)(pixels))
    return keras.Model(pixels, keras.layers.Dense(2, activation="softmax", name="probabilities")(hidden))


@pytest.fixture
def registry(tmp_path):
    """A store with one version of NAME, aliased champion, tagged as trained_model tags its run."""
    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    model = tiny_classifier()
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run() as run:
        mlflow.set_tags(
            {"dgx.class_names": json.dumps(["defective", "functional"]), "dgx.decision": json.dumps({"threshold": 0.3})}
        )
        info = mlflow.tensorflow.log_model(model, name="model", registered_model_name=NAME)
    MlflowClient(uri).set_registered_model_alias(NAME, "champion", str(info.registered_model_version))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")  # the process now points at another store
    yield uri, model, run.info.run_id
    mlflow.set_tracking_uri(None)


def test_the_champion_comes_from_the_store_named_not_the_process_default(registry):
    uri, model, run_id = registry
    champion = find_champion(uri, NAME)
    assert champion is not None and champion.run_id == run_id and champion.version == "1"
    assert champion.class_names == ("defective", "functional") and champion.decision.threshold == 0.3
    fetched = model_from_bytes(download_model(uri, champion), compile=False)
    pixels = np.random.default_rng(0).uniform(0, 255, (3, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fetched(pixels)), np.asarray(model(pixels)), atol=1e-6)


def test_no_champion_is_none_not_an_error(registry, tmp_path):
    uri, _, _ = registry
    MlflowClient(uri).delete_registered_model_alias(NAME, "champion")
    assert find_champion(uri, NAME) is None
    assert find_champion(uri, "never_registered") is None
