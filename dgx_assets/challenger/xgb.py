"""The challenger: gradient-boosted trees (xgboost.spark) on image_features' embeddings, across Spark executors.

Plain Python, no Dagster: ``train_challenger`` reads the exact image_features files trained_model reads,
keeps the same splits (the ``split`` column: train to fit, validation for early stopping, test to report),
weights classes as trained_model does, trains ``SparkXGBClassifier`` with one XGBoost worker per Spark task
slot (``device="cuda"`` when Spark gives the tasks GPUs), and evaluates on the test split with the same
report as trained_model (accuracy with its Wilson interval, macro-F1, per-class scores).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from dgx_assets.challenger.config import ChallengerConfig
from dgx_assets.training.dataset import (
    FeatureDataError,
    FeatureFiles,
    FeatureIndex,
    scan_features,
)


@dataclasses.dataclass
class ChallengerResult:
    booster: Any  # xgboost.Booster
    class_names: list[str]
    test: Any  # training.train.TestEvaluation
    params: dict[str, Any]
    split_counts: dict[str, dict[str, int]]
    embedding_dims: int
    num_workers: int
    device: str
    best_iteration: int | None
    training_seconds: float
    inference_ms_per_image: float  # one image at a time on the driver, the booster alone (embedding excluded)
    spark_scoring_seconds: float  # the whole test split scored by the Spark model on the executors


def task_gpus(spark: Any) -> float:
    """GPUs Spark gives each task (0 on plain local[N], which never hands out GPU addresses)."""
    return float(spark.sparkContext.getConf().get("spark.task.resource.gpu.amount", "0") or 0)


def resolve_device(spark: Any, device: str) -> str:
    return ("cuda" if task_gpus(spark) > 0 else "cpu") if device == "auto" else device


def _workers(spark: Any, config: ChallengerConfig) -> int:
    return config.num_workers or max(1, min(8, spark.sparkContext.defaultParallelism))


def embedding_frame(spark: Any, uris: list[str], index: FeatureIndex) -> Any:
    """Usable rows with their class index, sample weight and validation flag; fails when embeddings are missing."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(*uris)
    if "embedding" not in frame.columns:
        raise FeatureDataError("image_features has no embedding column: re-materialize it with embedding efficientnet_lite0")
    usable = frame.where((F.col("feature_status") == "ok") & F.col("embedding").isNotNull() & (F.size("embedding") > 0))
    missing = frame.where((F.col("feature_status") == "ok") & F.col("embedding").isNull()).limit(1).count()
    if missing:
        raise FeatureDataError(
            "image_features rows have no embedding (built with embedding: none): re-materialize "
            "image_features with embedding efficientnet_lite0 for the challenger"
        )
    names = F.array(*[F.lit(name) for name in index.class_names])
    weights = index.class_weights()
    weight = F.element_at(
        F.array(*[F.lit(float(weights[i])) for i in range(len(index.class_names))]),
        F.array_position(names, F.col("label")).cast("int"),
    )
    return usable.select(
        "sha256",
        "split",
        "embedding",
        (F.array_position(names, F.col("label")) - 1).cast("double").alias("label_index"),
        weight.alias("weight"),
        (F.col("split") == "validation").alias("is_validation"),
    )


def _xgboost_params(config: ChallengerConfig, device: str, workers: int) -> dict[str, Any]:
    """SparkXGBClassifier's parameters from the settings, the resolved device and the worker count."""
    return {
        "max_depth": config.max_depth,
        "n_estimators": config.n_estimators,
        "learning_rate": config.learning_rate,
        "subsample": config.subsample,
        "colsample_bytree": config.colsample_bytree,
        "early_stopping_rounds": config.early_stopping_rounds,
        "random_state": config.seed,
        "tree_method": "hist",
        "device": device,
        "num_workers": workers,
    }


def train_challenger(
    spark: Any, files: FeatureFiles, uris: list[str], config: ChallengerConfig, log: Any = None
) -> ChallengerResult:
    """Fit on train (+ validation for early stopping) across the executors; evaluate on test."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from xgboost.spark import SparkXGBClassifier

    from dgx_assets.training.train import classification_report

    say = log or (lambda message: None)
    index = scan_features(files)
    frame = embedding_frame(spark, uris, index)
    fit_rows = frame.where(F.col("split").isin("train", "validation"))
    workers, device = _workers(spark, config), resolve_device(spark, config.device)
    params = _xgboost_params(config, device, workers)
    classifier = SparkXGBClassifier(
        features_col="embedding",
        label_col="label_index",
        weight_col="weight",
        # The objective (binary or multi-class logistic) and its log-loss metric follow from the labels.
        validation_indicator_col="is_validation",
        **params,
    )
    say(
        f"SparkXGBClassifier on {index.rows('train')} train / {index.rows('validation')} validation embeddings, "
        f"{workers} workers on {device}"
    )
    started = time.perf_counter()
    model = classifier.fit(fit_rows.repartition(workers))
    training_seconds = time.perf_counter() - started

    started = time.perf_counter()
    scored = (
        model.transform(frame.where(F.col("split") == "test"))
        .select("label_index", vector_to_array(F.col("probability")).alias("p"))
        .collect()
    )
    scoring_seconds = time.perf_counter() - started
    if not scored:
        raise FeatureDataError("the 'test' split of image_features has no usable embeddings")
    labels = np.array([row.label_index for row in scored], dtype=np.int64)
    probabilities = np.array([row.p for row in scored], dtype=np.float64)
    report = classification_report(labels, probabilities, list(index.class_names), index.label_counts("train"))

    booster = model.get_booster()
    embeddings = np.array(
        frame.where(F.col("split") == "test")
        .select("embedding")
        .limit(max(1, config.latency_images))
        .toPandas()["embedding"]
        .tolist(),
        dtype=np.float32,
    )
    best = booster.attr("best_iteration")
    return ChallengerResult(
        booster=booster,
        class_names=list(index.class_names),
        test=report,
        params=params,
        split_counts=index.counts,
        embedding_dims=int(embeddings.shape[1]),
        num_workers=workers,
        device=device,
        best_iteration=int(best) if best is not None else None,
        training_seconds=training_seconds,
        inference_ms_per_image=booster_latency_ms(booster, embeddings),
        spark_scoring_seconds=scoring_seconds,
    )


def booster_latency_ms(booster: Any, embeddings: np.ndarray) -> float:
    """Median milliseconds to classify one embedding, as a device would (one at a time, after a warm-up)."""
    booster.inplace_predict(embeddings[:1])
    timings = []
    for row in embeddings:
        started = time.perf_counter()
        booster.inplace_predict(row[np.newaxis])
        timings.append((time.perf_counter() - started) * 1000)
    return float(np.median(timings))
