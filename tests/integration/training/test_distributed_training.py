"""trained_model across Spark executors: a real `local-cluster` Spark with two executors runs one barrier stage
of two MultiWorkerMirroredStrategy workers on disjoint shards; a worker that dies mid-training is recovered by
Spark's stage retry from the chief's checkpoint."""

from __future__ import annotations

import os

import pytest

from dgx_assets.training.dataset import Shard, make_dataset, scan_features
from dgx_assets.training.distributed import plan_shards, resolve_distribution, train_on_spark

# Two executors of one core and 1 GiB each, as separate JVMs; a failed barrier stage is retried.
CLUSTER_CONF = {
    "spark.master": "local-cluster[2,1,1024]",
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "1g",
}


@pytest.fixture(scope="module")
def cluster():
    from pyspark.sql import SparkSession

    # A session another test left running would be returned by getOrCreate with its own master.
    if (running := SparkSession.getActiveSession()) is not None:
        running.stop()
    builder = SparkSession.builder.appName("dgx-distributed-training-tests")
    for key, value in CLUSTER_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()


@pytest.fixture
def separable_config(small_train_config):
    # The synthetic cracks are separable: enough epochs of the small CNN reach >= 95 % on the test split.
    return small_train_config.model_copy(update={"epochs": 12, "patience": 12, "augment": False})


def test_shards_are_disjoint_and_cover_every_row(feature_files):
    index = scan_features(feature_files)
    for workers in (2, 3):  # 2: one file's row group each; 3: more workers than row groups, rows by stride
        shards, how = plan_shards(feature_files, workers)
        labels = [
            [int(y) for _, ys in make_dataset(feature_files, index, "train", 64, shard=s) for y in ys.numpy()] for s in shards
        ]
        assert how == ("row groups" if workers == 2 else "row stride")
        assert all(labels) and sum(map(len, labels)) == index.rows("train")
    whole = Shard(0, 1)
    assert sum(len(ys) for _, ys in make_dataset(feature_files, index, "train", 64, shard=whole)) == index.rows("train")


def test_auto_is_spark_on_a_cluster_deployment():
    assert resolve_distribution("auto", "local") == "single"
    assert resolve_distribution("auto", "standalone") == resolve_distribution("auto", "k8s") == "spark"
    assert resolve_distribution("single", "k8s") == "single"


@pytest.mark.timeout(300)
def test_two_spark_executors_train_one_model_together(cluster, feature_files, separable_config, tmp_path):
    epochs_logged = []
    result = train_on_spark(
        cluster,
        feature_files,
        separable_config,
        str(tmp_path / "ckpt"),
        on_epoch_end=lambda epoch, values: epochs_logged.append(epoch),
    )

    assert result.strategy == "MultiWorkerMirroredStrategy" and result.replicas == 2
    assert [w.index for w in result.workers] == [0, 1] and result.sharding == "row groups"
    assert len({w.pid for w in result.workers}) == 2  # two TensorFlow processes
    assert all(w.steps > 0 for w in result.workers)  # both took steps, the same number (synchronous)
    assert result.workers[0].steps == result.workers[1].steps
    index = scan_features(feature_files)
    assert sum(w.shard_rows for w in result.workers) == index.rows("train")  # disjoint shards, all rows
    assert result.epochs == epochs_logged and result.stage_attempt == 0 and result.resumed_from_epoch == 0
    assert result.test.metrics["accuracy"] >= 0.95, result.test.metrics
    assert result.params["workers"] == 2
    assert not any((tmp_path / "ckpt").iterdir())  # checkpoints removed once the model is out
    # One model, and it is the trained one: the driver's copy predicts what the test metrics say.
    assert result.model.output_shape[-1] == 2


class _LoseWorkerOnce:
    """A Keras callback (pickled to the workers) that kills worker 1's process in its third epoch, once: the
    marker file makes the retried stage's worker 1 carry on."""

    def __new__(cls, marker: str):
        import keras

        class LoseWorker(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                import json

                worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
                # Batch 0 of epoch 2 has all-reduced with the chief, so its epoch-1 checkpoint is written.
                if worker == 1 and self.epoch == 2 and batch == 0 and not os.path.exists(marker):
                    open(marker, "w").close()
                    os._exit(3)

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

        return LoseWorker()


@pytest.mark.timeout(300)
def test_a_lost_worker_is_retried_by_spark_and_resumes_from_the_checkpoint(cluster, feature_files, separable_config, tmp_path):
    config = separable_config.model_copy(update={"epochs": 4, "patience": 4})
    marker = tmp_path / "worker-1-lost"
    result = train_on_spark(
        cluster, feature_files, config, str(tmp_path / "ckpt"), extra_callbacks=[_LoseWorkerOnce(str(marker))]
    )

    assert marker.exists()  # the worker died once
    # Spark ran the barrier stage again (on a loaded machine a retry has itself been retried once), and training
    # went on from the chief's checkpoint instead of from the start.
    assert result.stage_attempt >= 1
    assert result.resumed_from_epoch >= 2 and result.epochs == list(range(result.resumed_from_epoch, 4))
    assert all(w.steps > 0 for w in result.workers)
