"""Train the defect classifier on image_features and evaluate it on the held-out test split.

Plain Python (no Dagster, no MLflow): ``train_classifier`` takes the exact feature files and a config and
returns the trained model with its history and test metrics. It runs under ``MirroredStrategy`` (all
visible GPUs, or one CPU replica), in mixed precision on GPUs only, with seeds fixed and op determinism
on, and checkpoints every epoch so that a run killed midway (a reclaimed spot node) resumes from the last
finished epoch when started again with the same checkpoint directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dgx_assets.training.dataset import FeatureFiles, FeatureIndex, make_dataset, scan_features
from dgx_assets.training.model import ModelConfig, ModelConfigError, build_classifier


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    backbone: str = "mobilenet_small"
    weights_path: str | None = None
    width: int = 48  # mobilenet_small width (filters of its first block)
    dropout: float = 0.2
    epochs: int = 40
    batch_size: int = 32  # per replica
    learning_rate: float = 2e-3
    patience: int = 8  # epochs without val_loss improvement before stopping
    warmup_epochs: int = 5  # early stopping ignores these: the first validation losses are noise
    seed: int = 42
    augment: bool = True
    mixed_precision: str = "auto"  # "auto": mixed_float16 on GPUs, float32 on CPU; "off": always float32
    shuffle_buffer: int = 2048
    deterministic: bool = True  # same data + config -> same metrics; off trades that for GPU speed

    @property
    def model(self) -> ModelConfig:
        return ModelConfig(backbone=self.backbone, weights_path=self.weights_path, dropout=self.dropout, width=self.width)

    def validate(self) -> None:
        self.model.validate()
        if self.warmup_epochs < 0:
            raise ModelConfigError(f"warmup_epochs must be 0 or more (setting 'warmup_epochs'), got {self.warmup_epochs}")
        for name in ("epochs", "batch_size", "patience", "shuffle_buffer"):
            if getattr(self, name) < 1:
                raise ModelConfigError(f"{name} must be at least 1 (setting {name!r}), got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ModelConfigError(f"learning_rate must be positive (setting 'learning_rate'), got {self.learning_rate}")
        if self.mixed_precision not in ("auto", "off"):
            raise ModelConfigError(f"mixed_precision must be 'auto' or 'off' (setting 'mixed_precision'), got {self.mixed_precision!r}")

    def fingerprint(self, data_digest: str) -> str:
        """Identifies one training job: a checkpoint is only resumed by the same config on the same data."""
        payload = json.dumps({"config": dataclasses.asdict(self), "data": data_digest}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclasses.dataclass
class TestEvaluation:
    metrics: dict[str, float]  # flat, MLflow-ready: accuracy, roc_auc, majority_baseline_accuracy, per-class p/r/f1
    confusion_matrix: list[list[int]]  # rows: true class, columns: predicted class
    labels: np.ndarray  # true class index per test image
    probabilities: np.ndarray  # [images, classes]


@dataclasses.dataclass
class TrainingResult:
    model: Any  # keras.Model, float32 pixels 0..255 in, softmax out
    class_names: list[str]
    input_shape: list[int]
    history: dict[str, list[float]]  # per-epoch metrics of this process's epochs
    epochs: list[int]  # epoch indices run in this process (starts > 0 after a resume)
    resumed_from_epoch: int  # 0 unless a checkpoint was restored
    best_epoch: int | None
    test: TestEvaluation
    strategy: str
    replicas: int
    precision_policy: str
    split_counts: dict[str, dict[str, int]]
    class_weights: dict[str, float]
    seconds: float

    @property
    def params(self) -> dict[str, Any]:
        return {
            "input_shape": "x".join(str(d) for d in self.input_shape),
            "classes": ",".join(self.class_names),
            "strategy": self.strategy,
            "replicas": self.replicas,
            "precision_policy": self.precision_policy,
        }


EpochCallback = Callable[[int, dict[str, float]], None]


def train_classifier(
    files: FeatureFiles,
    config: TrainConfig,
    checkpoint_dir: str,
    *,
    on_epoch_end: EpochCallback | None = None,
    extra_callbacks: Sequence[Any] = (),
    index: FeatureIndex | None = None,
) -> TrainingResult:
    """Train (or resume training) and evaluate on the test split."""
    config.validate()
    index = index or scan_features(files)
    started = time.monotonic()

    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        tf.config.experimental.disable_op_determinism()
    gpus = tf.config.list_physical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy() if gpus else tf.distribute.MirroredStrategy(["/cpu:0"])
    policy = "mixed_float16" if gpus and config.mixed_precision == "auto" else "float32"
    global_batch = config.batch_size * strategy.num_replicas_in_sync

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        with strategy.scope():
            model = build_classifier(config.model, index.tensor_shape, len(index.class_names))
            model.compile(
                optimizer=keras.optimizers.Adam(config.learning_rate),
                loss=keras.losses.SparseCategoricalCrossentropy(),
                metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            )
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)

    train_data = make_dataset(
        files, index, "train", global_batch, shuffle=True, augment=config.augment, seed=config.seed,
        shuffle_buffer=config.shuffle_buffer,
    )
    validation_data = make_dataset(files, index, "validation", global_batch)
    recorder = _epoch_recorder(on_epoch_end)
    early_stopping = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=config.patience, restore_best_weights=True, verbose=0,
        start_from_epoch=min(config.warmup_epochs, config.epochs - 1),
    )
    callbacks = [
        # Saves model, optimizer and epoch after every epoch; restores them when the job starts again.
        keras.callbacks.BackupAndRestore(checkpoint_dir, save_freq="epoch", delete_checkpoint=True),
        early_stopping,
        # Halve the step size when validation stalls: small noisy validation sets otherwise bounce around.
        keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=max(1, config.patience // 2), cooldown=1, min_lr=1e-5
        ),
        recorder,
        *extra_callbacks,
    ]
    class_weights = index.class_weights()
    model.fit(
        train_data,
        validation_data=validation_data,
        epochs=config.epochs,
        class_weight=class_weights,
        callbacks=callbacks,
        verbose=0,
    )
    best_epoch = None
    if early_stopping.best_epoch is not None and early_stopping.best_weights is not None:
        best_epoch = int(early_stopping.best_epoch)

    test = evaluate(model, make_dataset(files, index, "test", global_batch), index)
    return TrainingResult(
        model=model,
        class_names=list(index.class_names),
        input_shape=list(index.tensor_shape),
        history=recorder.history,
        epochs=recorder.epochs,
        resumed_from_epoch=recorder.epochs[0] if recorder.epochs else config.epochs,
        best_epoch=best_epoch,
        test=test,
        strategy=type(strategy).__name__,
        replicas=int(strategy.num_replicas_in_sync),
        precision_policy=policy,
        split_counts=index.counts,
        class_weights={name: round(class_weights[i], 6) for i, name in enumerate(index.class_names)},
        seconds=time.monotonic() - started,
    )


def evaluate(model: Any, test_data: Any, index: FeatureIndex) -> TestEvaluation:
    """Accuracy, per-class precision/recall/F1, ROC AUC, confusion matrix and the majority baseline."""
    labels, probabilities = [], []
    for images, batch_labels in test_data:
        probabilities.append(np.asarray(model(images, training=False), dtype=np.float64))
        labels.append(batch_labels.numpy())
    y_true = np.concatenate(labels)
    probs = np.concatenate(probabilities)
    return classification_report(y_true, probs, list(index.class_names), index.label_counts("train"))


def classification_report(
    y_true: np.ndarray, probabilities: np.ndarray, class_names: list[str], train_label_counts: list[int]
) -> TestEvaluation:
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support, roc_auc_score

    classes = list(range(len(class_names)))
    y_pred = probabilities.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=classes, zero_division=0
    )
    # "Better than guessing": always predict the most common training label.
    majority = int(np.argmax(train_label_counts))
    metrics = {
        "accuracy": float(np.mean(y_pred == y_true)),
        "majority_baseline_accuracy": float(np.mean(y_true == majority)),
        "macro_f1": float(np.mean(f1)),
        "images": float(len(y_true)),
    }
    try:
        if len(classes) == 2:
            metrics["roc_auc"] = float(roc_auc_score(y_true, probabilities[:, 1]))
        else:
            metrics["roc_auc"] = float(roc_auc_score(y_true, probabilities, multi_class="ovr", labels=classes))
    except ValueError:
        metrics["roc_auc"] = math.nan  # a class absent from the test split: AUC undefined
    for i, name in enumerate(class_names):
        metrics[f"precision_{name}"] = float(precision[i])
        metrics[f"recall_{name}"] = float(recall[i])
        metrics[f"f1_{name}"] = float(f1[i])
        metrics[f"support_{name}"] = float(support[i])
    return TestEvaluation(
        metrics=metrics,
        confusion_matrix=confusion_matrix(y_true, y_pred, labels=classes).tolist(),
        labels=y_true,
        probabilities=probabilities,
    )


def _epoch_recorder(forward: EpochCallback | None) -> Any:
    """A Keras callback collecting per-epoch logs and forwarding them (e.g. to MLflow) as each epoch ends."""
    import keras

    class EpochRecorder(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.history: dict[str, list[float]] = {}
            self.epochs: list[int] = []

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            values = {key: float(value) for key, value in (logs or {}).items()}
            self.epochs.append(int(epoch))
            for key, value in values.items():
                self.history.setdefault(key, []).append(value)
            if forward:
                forward(int(epoch), values)

    return EpochRecorder()
