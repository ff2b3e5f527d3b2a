"""Train the defect classifier on image_features and evaluate it on the held-out test split.

Plain Python (no Dagster, no MLflow): ``train_classifier`` takes the exact feature files and a config and
returns the trained model with its history and test metrics. It runs under ``MirroredStrategy`` (all
visible GPUs, or one CPU replica), in mixed precision on GPUs only, with seeds fixed and op determinism
on, and checkpoints every epoch so that a run killed midway (a reclaimed spot node) resumes from the last
finished epoch when started again with the same checkpoint directory.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dgx_assets.training import decision as decision_rules
from dgx_assets.training.config import TrainConfig
from dgx_assets.training.dataset import (
    FeatureFiles,
    FeatureIndex,
    make_dataset,
    read_embeddings,
    scan_features,
)
from dgx_assets.training.decision import Decision
from dgx_assets.training.model import OUTPUT_NAME, build_classifier, embedding_model, with_dihedral_views


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
    best_epoch: int | None  # Keras' 0-based index; people read it as `best_epoch + 1` (`human_epoch`)
    test: TestEvaluation
    strategy: str
    replicas: int
    precision_policy: str
    split_counts: dict[str, dict[str, int]]
    class_weights: dict[str, float]
    seconds: float
    decision: Decision = Decision()
    head_warm_start: HeadStart | None = None

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
    config = config.resolved()
    assert config.epochs is not None and config.class_weighting is not None  # resolved() fills the recipe fields
    index = index or scan_features(files)
    started = time.monotonic()

    strategy, policy = _strategy_and_policy(config)
    global_batch = config.batch_size * strategy.num_replicas_in_sync

    model = compiled_classifier(config, index, strategy, policy)
    head_start = None
    if config.warm_starts_head:
        head_start = warm_start_head(model, files, index, config)

    recorder, best_epoch, class_weights = _fit(
        model, files, index, config, global_batch, checkpoint_dir, on_epoch_end, extra_callbacks
    )

    model = with_dihedral_views(model, config.test_time_views)
    decision = choose_decision(model, files, index, config, global_batch)
    test = evaluate(model, make_dataset(files, index, "test", global_batch), index, decision)
    return TrainingResult(
        head_warm_start=head_start,
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
        class_weights={name: round((class_weights or {}).get(i, 1.0), 6) for i, name in enumerate(index.class_names)},
        seconds=time.monotonic() - started,
        decision=decision,
    )


def _strategy_and_policy(config: TrainConfig) -> tuple[Any, str]:
    """Seeds and determinism as configured; MirroredStrategy over the visible GPUs (mixed precision on GPUs with
    `mixed_precision: auto`), one CPU replica otherwise."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        tf.config.experimental.disable_op_determinism()
    gpus = tf.config.list_physical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy() if gpus else tf.distribute.MirroredStrategy(["/cpu:0"])
    return strategy, "mixed_float16" if gpus and config.mixed_precision == "auto" else "float32"


def training_datasets(files, index, config: TrainConfig, global_batch: int, shard=None) -> tuple[Any, Any]:
    """The shuffled, augmented training split (one worker's ``shard`` of it under Spark) and the validation split."""
    train_data = make_dataset(
        files,
        index,
        "train",
        global_batch,
        shuffle=True,
        augment=config.augment,
        seed=config.seed,
        shuffle_buffer=config.shuffle_buffer,
        shard=shard,
        soft_targets=config.soft_targets,
        one_hot=config.dense_targets,
        balance_classes=config.balanced_sampling,
    )
    validation_data = make_dataset(
        files, index, "validation", global_batch, soft_targets=config.soft_targets, one_hot=config.dense_targets
    )
    return train_data, validation_data


def _fit(model, files, index, config: TrainConfig, global_batch: int, checkpoint_dir: str, on_epoch_end, extra_callbacks):
    """Fit with checkpoints, early stopping and the learning-rate schedule; returns the epoch recorder, the best
    epoch restored (None when early stopping kept the last) and the class weights used."""
    import keras

    train_data, validation_data = training_datasets(files, index, config, global_batch)
    recorder = _epoch_recorder(on_epoch_end)
    early_stopping = _early_stopping(config)
    callbacks = [
        # Saves model, optimizer and epoch after every epoch; restores them when the job starts again.
        keras.callbacks.BackupAndRestore(checkpoint_dir, save_freq="epoch", delete_checkpoint=True),
        early_stopping,
        _learning_rate_schedule(config),
        recorder,
        *extra_callbacks,
    ]
    class_weights = index.class_weights() if config.class_weighting else None
    model.fit(
        # Repeated, with the epoch's length given: Keras keeps one training iterator for the whole run. With one
        # per epoch, waiting for the half-read one's threads to stop took 25-40 s at every epoch start on 2 cores.
        train_data.repeat(),
        steps_per_epoch=steps_per_epoch(index, global_batch),
        validation_data=validation_data,
        epochs=config.epochs,
        class_weight=class_weights,
        callbacks=callbacks,
        verbose=0,
    )
    best_epoch = None
    if early_stopping.best_epoch is not None and early_stopping.best_weights is not None:
        best_epoch = int(early_stopping.best_epoch)
    return recorder, best_epoch, class_weights


def compiled_classifier(config: TrainConfig, index: FeatureIndex, strategy: Any, policy: str) -> Any:
    """The classifier built and compiled under ``strategy`` in precision ``policy`` (a resolved config)."""
    import keras

    assert config.learning_rate is not None  # a resolved config
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        with strategy.scope():
            model = build_classifier(config.model, index.tensor_shape, len(index.class_names))
            dense = config.dense_targets  # class probabilities instead of class indices
            model.compile(
                optimizer=keras.optimizers.Adam(config.learning_rate),
                loss=keras.losses.CategoricalCrossentropy(label_smoothing=config.label_smoothing)
                if dense
                else keras.losses.SparseCategoricalCrossentropy(),
                metrics=[
                    (keras.metrics.CategoricalAccuracy if dense else keras.metrics.SparseCategoricalAccuracy)(name="accuracy")
                ],
            )
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    return model


def steps_per_epoch(index: FeatureIndex, global_batch: int) -> int:
    """Batches in one pass over the training split, the last one partial."""
    return max(1, math.ceil(index.rows("train") / global_batch))


def _early_stopping(config: TrainConfig) -> Any:
    import keras

    assert config.patience is not None and config.warmup_epochs is not None and config.epochs is not None  # resolved

    return keras.callbacks.EarlyStopping(
        monitor="val_loss",
        patience=config.patience,
        restore_best_weights=True,
        verbose=0,
        start_from_epoch=min(config.warmup_epochs, config.epochs - 1),
    )


@dataclasses.dataclass(frozen=True)
class HeadStart:
    """How the classifier's head was initialised before fine-tuning."""

    used: bool
    reason: str  # why not, or what it was fitted on
    train_accuracy: float | None = None


def warm_start_head(model: Any, files: FeatureFiles, index: FeatureIndex, config: TrainConfig) -> HeadStart:
    """Fit the softmax head on image_features' stored embeddings (a logistic regression: seconds, not
    epochs) and copy it into the classifier, so fine-tuning starts from a good head rather than a random
    one whose large early gradients would wreck the pretrained blocks.

    Only when the stored embeddings are this classifier's own pooled features: a few are recomputed and
    compared, so features made by another backbone (Lite0's for a Lite2 classifier: 1,280 values too), other
    weights or another size are skipped, not trusted. ``config`` is resolved (its recipe fields filled in).
    """
    from sklearn.linear_model import LogisticRegression

    stored = read_embeddings(files, index, "train")
    if stored is None:
        return HeadStart(False, "image_features has no embedding column values (embedding: none)")
    vectors, labels, sample = stored
    pooled = embedding_model(model)
    if vectors.shape[1] != pooled.output_shape[-1]:
        return HeadStart(False, f"stored embeddings have {vectors.shape[1]} values, the model {pooled.output_shape[-1]}")
    recomputed = np.asarray(pooled(sample.astype(np.float32), training=False))
    mismatch = float(np.max(np.abs(recomputed - vectors[: len(sample)]) / (np.abs(vectors[: len(sample)]).max() + 1e-6)))
    if mismatch > 1e-2:
        # The embedding setting that gives this classifier's own features: its weights file, or the packaged ones.
        own = config.weights_path or config.backbone
        return HeadStart(
            False,
            f"stored embeddings are not this backbone's ({config.backbone}; relative difference {mismatch:.3f}): "
            f"materialize image_features with embedding {own} to warm-start the head",
        )
    # The head starts from the class balance the fine-tune will see.
    balanced = "balanced" if config.class_weighting or config.balanced_sampling else None
    head = LogisticRegression(C=0.05, max_iter=2000, class_weight=balanced, random_state=config.seed).fit(vectors, labels)
    weights, bias = head.coef_.T, head.intercept_
    if weights.shape[1] == 1:  # binary: sklearn keeps one logit; softmax over [-z/2, z/2] is the same model
        weights, bias = np.hstack([-weights / 2, weights / 2]), np.array([-bias[0] / 2, bias[0] / 2])
    model.get_layer(OUTPUT_NAME).set_weights([weights.astype(np.float32), bias.astype(np.float32)])
    return HeadStart(True, f"logistic regression on {len(labels)} stored embeddings", float(head.score(vectors, labels)))


def split_predictions(model: Any, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities) of every image of a split's dataset."""
    import tensorflow as tf

    # As a graph: eager calls took 1.9x as long on 2 cores (no fused convolutions), and the 8-view model
    # evaluates two splits after training.
    predict = tf.function(lambda images: model(images, training=False), reduce_retracing=True)
    labels, probabilities = [], []
    for images, batch_labels in data:
        probabilities.append(np.asarray(predict(images), dtype=np.float64))
        labels.append(batch_labels.numpy())
    return np.concatenate(labels), np.concatenate(probabilities)


def choose_decision(model: Any, files: FeatureFiles, index: FeatureIndex, config: TrainConfig, batch: int) -> Decision:
    """The decision rule of this config (the model already has the dihedral views in its graph when asked for);
    the threshold, when tuned, from the validation split."""
    positive = decision_rules.positive_index(index.class_names)
    if not config.tune_threshold or positive is None:
        return Decision(config.test_time_views, None, positive)
    labels, probabilities = split_predictions(model, make_dataset(files, index, "validation", batch))
    threshold = decision_rules.choose_threshold(labels, probabilities, positive)
    return Decision(config.test_time_views, decision_rules.shrink_toward_half(threshold, config.threshold_shrinkage), positive)


def evaluate(model: Any, test_data: Any, index: FeatureIndex, decision: Decision | None = None) -> TestEvaluation:
    """Accuracy, per-class precision/recall/F1, ROC AUC, confusion matrix and the majority baseline."""
    decision = decision or Decision()
    y_true, probs = split_predictions(model, test_data)
    return classification_report(y_true, probs, list(index.class_names), index.label_counts("train"), decision)


def classification_report(
    y_true: np.ndarray,
    probabilities: np.ndarray,
    class_names: list[str],
    train_label_counts: list[int],
    decision: Decision | None = None,
) -> TestEvaluation:
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support, roc_auc_score

    classes = list(range(len(class_names)))
    y_pred = decision_rules.decide(probabilities, *((decision.threshold, decision.positive_index) if decision else (None, None)))
    # sklearn is unannotated: pyright would infer a str zero_division and float scores from its code
    per_class_scores: Any = precision_recall_fscore_support
    precision, recall, f1, support = per_class_scores(y_true, y_pred, labels=classes, zero_division=0)
    # "Better than guessing": always predict the most common training label.
    majority = int(np.argmax(train_label_counts))
    correct = int(np.sum(y_pred == y_true))
    low, high = wilson_interval(correct, len(y_true))
    metrics = {
        "accuracy": correct / len(y_true),
        "accuracy_ci95_low": low,
        "accuracy_ci95_high": high,
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


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion: unlike the normal approximation it stays inside
    [0, 1] and is honest near 100 %, where test accuracies of a few hundred images live."""
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def _learning_rate_schedule(config: TrainConfig) -> Any:
    """A callback setting the step size per epoch: a function of the epoch index alone for "cosine", so a
    run resumed from a checkpoint continues the same curve."""
    import keras

    assert config.learning_rate is not None and config.epochs is not None and config.patience is not None  # resolved
    if config.schedule == "cosine":
        peak, epochs = config.learning_rate, config.epochs
        return keras.callbacks.LearningRateScheduler(lambda epoch, _lr: peak * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs)))
    # Halve the step size when validation stalls: small noisy validation sets otherwise bounce around.
    return keras.callbacks.ReduceLROnPlateau(
        monitor="val_loss", factor=0.5, patience=max(1, config.patience // 2), cooldown=1, min_lr=1e-5
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
