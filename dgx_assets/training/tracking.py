"""The MLflow side of training: one run per trained_model materialization, holding what produced the model.

``train_and_track`` wraps ``train.train_classifier`` in an MLflow run with params, per-epoch metrics, test
metrics, plots, the model (signature + input example), the training and test datasets as run inputs with
digests of the exact Parquet files, tags linking back to Dagster and git, and a hardware baseline; then
registers the model under one name and points the alias ``candidate`` at the new version.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dgx_assets import links
from dgx_assets.training.dataset import FeatureFiles, scan_features
from dgx_assets.training.train import TrainConfig, TrainingResult, train_classifier

CANDIDATE_ALIAS = "candidate"
CHAMPION_ALIAS = "champion"
TRACKING_SETTING = "MLFLOW_TRACKING_URI (resource 'mlflow', field 'tracking_uri')"
# MLflow caps a dataset digest at 36 characters.
_DIGEST_CHARS = 32
_TAG_LIMIT = 5000


class TrackingConfigError(ValueError):
    """The MLflow settings cannot work; the message names the setting."""


@dataclasses.dataclass(frozen=True)
class TrackingConfig:
    tracking_uri: str
    experiment_name: str = "dgx_assets"
    registered_model_name: str = "dgx_defect_classifier"
    ui_url: str | None = None  # where a browser opens MLflow (links in Dagster and the report)
    dagster_ui_url: str | None = None  # where a browser opens Dagster (links back from MLflow)


@dataclasses.dataclass(frozen=True)
class DagsterLineage:
    """Where in Dagster this training run comes from."""

    run_id: str | None = None
    asset_key: str = "trained_model"
    partition_keys: tuple[str, ...] = ()  # image_features partitions consumed
    code_version: str | None = None
    job_name: str | None = None


@dataclasses.dataclass(frozen=True)
class FileEntry:
    path: str
    size_bytes: int
    sha256: str


@dataclasses.dataclass
class TrackedModel:
    run_id: str
    experiment_id: str
    run_url: str | None  # a link when the tracking store is an MLflow server
    model_name: str
    model_version: str
    model_uri: str  # models:/<name>/<version>
    training: TrainingResult
    data_digest: str
    files: list[FileEntry]
    hardware: dict[str, Any]
    backbone: str
    pretrained_weights: dict[str, str]  # pretrained_weights_params(); empty when trained from scratch


# --- settings ---------------------------------------------------------------------------------------
def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when the tracking store cannot be reached."""
    if not uri:
        raise TrackingConfigError(f"no MLflow tracking URI configured: set {TRACKING_SETTING}")
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
            response.raise_for_status()
        except requests.RequestException as exc:
            raise TrackingConfigError(
                f"MLflow tracking server {uri!r} is unreachable ({type(exc).__name__}: {exc}); "
                f"start it or fix {TRACKING_SETTING}"
            ) from exc
        return
    if scheme == "sqlite":
        database = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not database or database == ":memory:":
            raise TrackingConfigError(f"{uri!r} is not a sqlite file URI (sqlite:////abs/path.db): fix {TRACKING_SETTING}")
        _ensure_writable_dir(Path(database).parent, uri)
        return
    if scheme in ("", "file"):
        _ensure_writable_dir(Path(urlparse(uri).path if scheme else uri), uri)
        return
    if scheme not in ("databricks", "postgresql", "mysql", "mssql"):
        raise TrackingConfigError(f"unsupported MLflow tracking URI scheme {scheme!r} in {uri!r}: fix {TRACKING_SETTING}")


def _ensure_writable_dir(folder: Path, uri: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingConfigError(f"cannot create {folder} for MLflow store {uri!r} ({exc}): fix {TRACKING_SETTING}") from exc
    if not os.access(folder, os.W_OK):
        raise TrackingConfigError(f"{folder} for MLflow store {uri!r} is not writable: fix {TRACKING_SETTING}")


def default_artifact_location(tracking_uri: str) -> str | None:
    """Next to a sqlite store (MLflow would otherwise write ./mlruns wherever the process runs)."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return None


# MLflow 3's UI opens an experiment on its GenAI overview unless this tag says it holds model training runs.
EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT = "mlflow.experimentKind", "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the description the MLflow UI shows (Markdown) for experiments and runs
EXPERIMENT_DESCRIPTION = (
    "Training runs of the dgx_assets `trained_model` asset: a defect classifier on solar-cell "
    "electroluminescence images, one run per Dagster materialization (tags `dagster.*` link back)."
)


def ensure_experiment(client: Any, name: str, tracking_uri: str) -> str:
    """The experiment's id, created when missing; tagged as a model-training experiment either way."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        experiment_id = client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))
        tags = {}
    else:
        experiment_id, tags = experiment.experiment_id, experiment.tags
    if tags.get(EXPERIMENT_KIND_TAG) != TRAINING_EXPERIMENT:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT)
    if not tags.get(DESCRIPTION_TAG):
        client.set_experiment_tag(experiment_id, DESCRIPTION_TAG, EXPERIMENT_DESCRIPTION)
    return experiment_id


# --- lineage ----------------------------------------------------------------------------------------
def describe_files(files: FeatureFiles) -> list[FileEntry]:
    """Path, size and content hash of every Parquet file, streamed (no file is held in memory)."""
    entries = []
    for path in sorted(files.paths):
        digest = hashlib.sha256()
        size = 0
        with files.filesystem.open_input_stream(path) as stream:
            while chunk := stream.read(1 << 22):
                digest.update(chunk)
                size += len(chunk)
        entries.append(FileEntry(path=path, size_bytes=size, sha256=digest.hexdigest()))
    return entries


def dataset_digest(entries: Sequence[FileEntry], splits: Sequence[str]) -> str:
    """Changes when any file's bytes change, a file is added or removed, or the splits read change."""
    payload = json.dumps({"splits": list(splits), "files": [dataclasses.asdict(e) for e in entries]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def code_revision() -> str | None:
    """The git commit of the code (DGX_GIT_COMMIT when the image was built without .git)."""
    if os.environ.get("DGX_GIT_COMMIT"):
        return os.environ["DGX_GIT_COMMIT"]
    from dgx_assets import settings

    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=settings.repo_root(), capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None if completed.returncode == 0 else None


def hardware_baseline(timeout_s: float = 30.0) -> dict[str, Any]:
    """What trained the model: GPUs and nvidia-smi clocks/power/temperature where there are GPUs, CPU always."""
    baseline: dict[str, Any] = {
        "captured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_quota": _cgroup_cpu_quota(),
        "memory_bytes": _memory_bytes(),
        "gpus": [],
        "kind": "cpu",
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout_s, check=True)
            query = subprocess.run(
                [smi, "-q", "-d", "POWER,CLOCK,TEMPERATURE"], capture_output=True, text=True, timeout=timeout_s, check=True
            )
            baseline["gpus"] = [line.strip() for line in listing.stdout.splitlines() if line.strip()]
            baseline["nvidia_smi_query"] = query.stdout
            baseline["kind"] = "gpu" if baseline["gpus"] else "cpu"
        except (OSError, subprocess.SubprocessError) as exc:
            baseline["nvidia_smi_error"] = f"{type(exc).__name__}: {exc}"
    return baseline


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_cpu_quota() -> float | None:
    """CPUs a container may use (Kubernetes limits), which os.cpu_count() does not show."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        return None


def hardware_tags(baseline: dict[str, Any]) -> dict[str, str]:
    tags = {
        "hardware.kind": baseline["kind"],
        "hardware.cpu_model": str(baseline["cpu_model"]),
        "hardware.cpu_cores": str(baseline["cpu_cores"]),
        "hardware.memory_gib": f"{(baseline['memory_bytes'] or 0) / 2**30:.1f}",
        "hardware.gpu_count": str(len(baseline["gpus"])),
    }
    if baseline["gpus"]:
        tags["hardware.gpus"] = "; ".join(baseline["gpus"])[:_TAG_LIMIT]
    return tags


def _lineage_tags(lineage: DagsterLineage, commit: str | None) -> dict[str, str]:
    tags = {
        "dagster.asset_key": lineage.asset_key,
        "dagster.partition_keys": ",".join(lineage.partition_keys)[:_TAG_LIMIT],
        "dagster.partition_count": str(len(lineage.partition_keys)),
    }
    optional = {
        "dagster.run_id": lineage.run_id,
        "dagster.code_version": lineage.code_version,
        "dagster.job": lineage.job_name,
        "mlflow.source.git.commit": commit,
        "git.commit": commit,
    }
    return tags | {key: value for key, value in optional.items() if value}


def _feature_dataset(name: str, uri: str, digest: str, profile: dict[str, Any]) -> Any:
    """An MLflow dataset that describes Parquet files without loading them."""
    from mlflow.data.dataset_source import DatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import ColSpec, DataType, Schema

    class LakeDatasetSource(DatasetSource):
        def __init__(self, source_uri: str):
            self._uri = source_uri

        @staticmethod
        def _get_source_type() -> str:
            return "dgx_lake"

        def load(self) -> str:
            return self._uri

        @staticmethod
        def _can_resolve(raw_source: Any) -> bool:
            return False

        @classmethod
        def _resolve(cls, raw_source: Any) -> "LakeDatasetSource":
            return cls(str(raw_source))

        def to_dict(self) -> dict[str, Any]:
            return {"uri": self._uri}

        @classmethod
        def from_dict(cls, source_dict: dict[Any, Any]) -> "LakeDatasetSource":
            return cls(source_dict["uri"])

    class FeatureDataset(MetaDataset):
        @property
        def profile(self) -> dict[str, Any]:
            return profile

        def to_dict(self) -> dict[str, str]:
            return super().to_dict() | {"profile": json.dumps(profile)}

    schema = Schema([
        ColSpec(DataType.string, "sha256"), ColSpec(DataType.string, "label"), ColSpec(DataType.string, "split"),
        ColSpec(DataType.binary, "tensor"), ColSpec(DataType.string, "tensor_shape"),
    ])
    return FeatureDataset(LakeDatasetSource(uri), name=name, digest=digest[:_DIGEST_CHARS], schema=schema)


# --- the run --------------------------------------------------------------------------------------
def train_and_track(
    files: FeatureFiles,
    features_uri: str,
    config: TrainConfig,
    tracking: TrackingConfig,
    checkpoint_root: str,
    lineage: DagsterLineage = DagsterLineage(),
    log: Any = None,
) -> TrackedModel:
    """Train in an MLflow run, register the model and alias the new version ``candidate``."""
    config.validate()  # bad settings fail before anything is written anywhere
    check_tracking_uri(tracking.tracking_uri)
    index = scan_features(files)
    say = log or (lambda message: None)

    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    mlflow.set_tracking_uri(tracking.tracking_uri)
    client = MlflowClient(tracking.tracking_uri)
    experiment_id = ensure_experiment(client, tracking.experiment_name, tracking.tracking_uri)
    entries = describe_files(files)
    train_digest = dataset_digest(entries, ["train", "validation"])
    test_digest = dataset_digest(entries, ["test"])
    data_digest = dataset_digest(entries, ["train", "validation", "test"])
    checkpoint_dir = str(Path(checkpoint_root) / config.fingerprint(data_digest))
    commit = code_revision()
    hardware = hardware_baseline()

    run_name = f"trained_model-{(lineage.run_id or 'adhoc')[:8]}-{time.strftime('%Y%m%d-%H%M%S')}"
    tags = _lineage_tags(lineage, commit) | hardware_tags(hardware) | {"dgx.data_digest": data_digest}
    dagster_run_url = links.dagster_run(tracking.dagster_ui_url, lineage.run_id) \
        if tracking.dagster_ui_url and lineage.run_id else None
    if dagster_run_url:
        tags["dagster.run_url"] = dagster_run_url
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        run_id = run.info.run_id
        say(f"MLflow run {run_id} in experiment {tracking.experiment_name!r}")
        resolved = config.resolved()
        mlflow.log_params({key: ("" if value is None else value) for key, value in dataclasses.asdict(resolved).items()})
        weights = pretrained_weights_params(resolved)
        if weights:
            mlflow.log_params(weights)
        mlflow.log_dict(hardware, "hardware/baseline.json")
        if hardware.get("nvidia_smi_query"):
            mlflow.log_text(hardware["nvidia_smi_query"], "hardware/nvidia-smi-q.txt")
        mlflow.log_dict(
            {"features_uri": features_uri, "partition_keys": list(lineage.partition_keys),
             "files": [dataclasses.asdict(e) for e in entries], "split_counts": index.counts,
             "failed_feature_rows": index.failed_rows},
            "datasets/feature_files.json",
        )
        for context, digest, splits in (("training", train_digest, ["train", "validation"]), ("test", test_digest, ["test"])):
            profile = {
                "num_rows": sum(index.rows(split) for split in splits),
                "splits": {split: index.counts[split] for split in splits},
                "files": len(entries),
                "partitions": list(lineage.partition_keys)[:200],
                "sha256": digest,
            }
            dataset = _feature_dataset(f"image_features[{'+'.join(splits)}]", features_uri, digest, profile)
            mlflow.log_input(dataset, context=context, tags={"splits": ",".join(splits)})

        def log_epoch(epoch: int, values: dict[str, float]) -> None:
            now = int(time.time() * 1000)
            metrics = [Metric(key, value, now, epoch) for key, value in values.items() if math.isfinite(value)]
            client.log_batch(run_id, metrics=metrics)
            say(f"epoch {epoch}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(values.items())))

        result = train_classifier(files, config, checkpoint_dir, on_epoch_end=log_epoch, index=index)

        if result.head_warm_start is not None:
            mlflow.set_tag("dgx.head_warm_start", result.head_warm_start.reason)
        mlflow.log_params(result.params | {"global_batch_size": config.batch_size * result.replicas,
                                           "train_images": index.rows("train"),
                                           "validation_images": index.rows("validation"),
                                           "test_images": index.rows("test")})
        # The final evaluation gets a step of its own, after the last epoch: the logged model links the metrics
        # of the step it is logged at, so it carries the test metrics and not an epoch's training metrics.
        evaluation_step = max(result.epochs, default=-1) + 1
        test_metrics = {f"test_{k}": v for k, v in result.test.metrics.items() if math.isfinite(v)}
        mlflow.log_metrics(test_metrics | {"training_seconds": result.seconds}, step=evaluation_step)
        mlflow.set_tags({
            "dgx.resumed_from_epoch": str(result.resumed_from_epoch),
            "dgx.best_epoch": str(result.best_epoch),
            "dgx.class_names": json.dumps(result.class_names),
        })
        mlflow.log_dict({"class_names": result.class_names, "class_weights": result.class_weights,
                         "confusion_matrix": result.test.confusion_matrix}, "evaluation/test_report.json")
        for artifact, figure in _figures(result).items():
            mlflow.log_figure(figure, artifact)

        model_info = _log_model(mlflow, result, tracking.registered_model_name, step=evaluation_step)
        version = str(model_info.registered_model_version)
        _describe(client, tracking, run_id, version, result, lineage, dagster_run_url)
        client.set_registered_model_alias(tracking.registered_model_name, CANDIDATE_ALIAS, version)
        for key, value in {"dagster.run_id": lineage.run_id, "git.commit": commit, "dgx.data_digest": data_digest}.items():
            if value:
                client.set_model_version_tag(tracking.registered_model_name, version, key, value)
        say(f"registered {tracking.registered_model_name} version {version} as {CANDIDATE_ALIAS!r}")

    return TrackedModel(
        run_id=run_id,
        experiment_id=experiment_id,
        run_url=run_url(tracking.tracking_uri, experiment_id, run_id, tracking.ui_url),
        model_name=tracking.registered_model_name,
        model_version=version,
        model_uri=f"models:/{tracking.registered_model_name}/{version}",
        training=result,
        data_digest=data_digest,
        files=entries,
        hardware=hardware,
        backbone=resolved.backbone,
        pretrained_weights=weights,
    )


def pretrained_weights_params(config: TrainConfig) -> dict[str, str]:
    """Which pretrained weights the model started from (package, version, file, sha256), for MLflow."""
    from dgx_assets.training.model import EFFICIENTNET_LITE0

    if config.backbone != EFFICIENTNET_LITE0:
        return {}
    weights = config.model.pretrained_weights()
    return {
        "pretrained_weights_file": os.path.basename(weights.path),
        "pretrained_weights_sha256": weights.sha256,
        "pretrained_weights_package": weights.package or "user file",
        "pretrained_weights_package_version": weights.package_version or "",
    }


def run_url(tracking_uri: str, experiment_id: str, run_id: str, ui_url: str | None = None) -> str | None:
    """The run's page in the MLflow UI: under `ui_url`, else under an http(s) tracking server, else None."""
    if ui_url:
        return links.mlflow_run(ui_url, experiment_id, run_id)
    if urlparse(tracking_uri).scheme in ("http", "https"):
        return links.mlflow_run(tracking_uri, experiment_id, run_id)
    return None


def _describe(client: Any, tracking: TrackingConfig, run_id: str, version: str, result: TrainingResult,
              lineage: DagsterLineage, dagster_run_url: str | None) -> None:
    """Descriptions (Markdown) on the run, the registered model and the version, with links back to Dagster."""
    metrics = result.test.metrics
    made_by = (f"[Dagster run {lineage.run_id[:8]}]({dagster_run_url})" if dagster_run_url
               else f"Dagster run `{lineage.run_id}`" if lineage.run_id else "an ad-hoc call")
    partitions = ", ".join(lineage.partition_keys) or "none"
    summary = (
        f"Defect classifier ({', '.join(result.class_names)}) made by {made_by} materializing `{lineage.asset_key}` "
        f"on the image_features batches {partitions}. Test accuracy {metrics.get('accuracy', float('nan')):.1%} "
        f"(majority baseline {metrics.get('majority_baseline_accuracy', float('nan')):.1%}), macro-F1 "
        f"{metrics.get('macro_f1', float('nan')):.3f}; best epoch {result.best_epoch}."
    )
    client.set_tag(run_id, DESCRIPTION_TAG, summary)
    client.update_model_version(tracking.registered_model_name, version,
                                description=f"{summary} Registered with the alias `{CANDIDATE_ALIAS}`.")
    if dagster_run_url:
        client.set_model_version_tag(tracking.registered_model_name, version, "dagster.run_url", dagster_run_url)
    registered = client.get_registered_model(tracking.registered_model_name)
    if not registered.description:
        client.update_registered_model(tracking.registered_model_name, description=(
            "Defect classifier for solar-cell electroluminescence images, trained by the dgx_assets `trained_model` "
            f"asset. Alias `{CANDIDATE_ALIAS}`: the latest trained version; `champion`: the version promoted after "
            "its quality gates passed (the one edge devices get)."))


def alias_metric(tracking_uri: str, model_name: str, alias: str, metric: str) -> tuple[str, float] | None:
    """(version, value of ``metric`` in its training run) for the version holding ``alias``, or None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri)
    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except MlflowException:
        return None
    value = client.get_run(version.run_id).data.metrics.get(metric) if version.run_id else None
    return (str(version.version), float(value)) if value is not None else None


def _log_model(mlflow: Any, result: TrainingResult, model_name: str, step: int = 0) -> Any:
    import keras
    import numpy as np
    import tensorflow as tf
    from mlflow.models import infer_signature

    # One real-looking input (mid-grey pixels) at the model's shape: float32 0..255, like callers send.
    example = np.full((1, *result.input_shape), 127.0, dtype=np.float32)
    signature = infer_signature(example, np.asarray(result.model(example, training=False)))
    # mlflow.tensorflow, not mlflow.keras: the keras flavor of MLflow 3.17 fails to save an input example
    # (it writes it before creating the model folder; mlflow/mlflow#16183). Both save the .keras format.
    import mlflow.tensorflow

    return mlflow.tensorflow.log_model(
        result.model,
        name="model",
        signature=signature,
        input_example=example,
        registered_model_name=model_name,
        step=step,  # the logged model carries the metrics of this step
        # Pinned explicitly: inferring requirements would reload the model in a subprocess.
        pip_requirements=[f"tensorflow=={tf.__version__}", f"keras=={keras.__version__}"],
        metadata={"class_names": result.class_names, "input_shape": result.input_shape},
    )


def hunted_class(names: list[str], labels: Any) -> int:
    """The class an inspector looks for, whose ROC curve a two-class model shows: `defective` when there is
    one, else the rarer class of the test labels."""
    import numpy as np

    if "defective" in names:
        return names.index("defective")
    return int(np.argmin(np.bincount(np.asarray(labels, dtype=int), minlength=len(names))))


def _figures(result: TrainingResult) -> dict[str, Any]:
    """Confusion matrix, training curves and ROC curve(s) as matplotlib figures (no pyplot state)."""
    import numpy as np
    from matplotlib.figure import Figure
    from sklearn.metrics import roc_curve

    names = result.class_names
    matrix = np.asarray(result.test.confusion_matrix)
    confusion = Figure(figsize=(4 + 0.4 * len(names), 3.5 + 0.4 * len(names)))
    ax = confusion.subplots()
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center", color="black")
    ax.set_title(f"test confusion matrix (accuracy {result.test.metrics['accuracy']:.3f})")
    confusion.tight_layout()

    curves = Figure(figsize=(9, 3.5))
    loss_ax, acc_ax = curves.subplots(1, 2)
    for key, ax in (("loss", loss_ax), ("accuracy", acc_ax)):
        for prefix in ("", "val_"):
            if prefix + key in result.history:
                ax.plot(result.epochs, result.history[prefix + key], marker="o", label=prefix + key)
        if result.best_epoch is not None:  # the weights the model keeps
            ax.axvline(result.best_epoch, color="#c33", linestyle="--", label=f"best epoch ({result.best_epoch})")
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.legend()
    curves.tight_layout()

    roc = Figure(figsize=(4.5, 4))
    ax = roc.subplots()
    for i in range(len(names)) if len(names) > 2 else [hunted_class(names, result.test.labels)]:
        name, truth = names[i], result.test.labels == i
        if truth.any() and not truth.all():
            fpr, tpr, _ = roc_curve(truth, result.test.probabilities[:, i])
            ax.plot(fpr, tpr, label=name)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"ROC (AUC {result.test.metrics.get('roc_auc', float('nan')):.3f})")
    ax.legend()
    roc.tight_layout()
    return {"plots/confusion_matrix.png": confusion, "plots/training_curves.png": curves, "plots/roc_curve.png": roc}
