"""The edge_model build, end to end, as plain Python (the Dagster asset only passes settings in).

Reads trained_model's saved model and model_info.json, picks calibration images from raw_images' training
split and test images present in both raw_images (original bytes, what a device sees) and image_features
(the tensors trained_model was evaluated on), converts, measures parity, exports the Triton repository,
writes everything to `<lake>/edge_model/` atomically and logs it to trained_model's MLflow run.

Layout of `<lake>/edge_model/`:

    model.tflite        the edge model (uint8 [1, raw_height, raw_width, C] in, float32 probabilities out), the
                        format the ladder shipped, its contract embedded as metadata (edge/tflite_metadata.py)
    edge_model.json     the device contract (format, signature, shapes, raw size, class names, decision rule) and provenance
    parity.json         the shipped format's parity figures the blocking check gates on, the gate, every format tried
    parity.png          probabilities Keras vs TFLite, latency distributions
    triton/<name>/...   Triton model repository (SavedModel of trained_model + config.pbtxt)
"""

from __future__ import annotations

import json
import posixpath
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dgx_assets.config_parts import part_of
from dgx_assets.edge import convert, parity, triton
from dgx_assets.edge.config import EdgeModelConfig
from dgx_assets.edge.ladder import EdgeInputs, FormatTrial, LadderOutcome, run_ladder
from dgx_assets.fleet.fetch import record_edge_model_digest
from dgx_assets.lake.store import Lake
from dgx_assets.station.runtime import CONTRACT_FILE, MLFLOW_ARTIFACT_DIR, MODEL_FILE  # what edge-run/edge-fetch read
from dgx_assets.station.tflite_metadata import embed_contract
from dgx_assets.training.decision import Decision

EDGE_ASSET = "edge_model"
PARITY_FILE = "parity.json"
TRAINED_ASSET = "trained_model"
_INFO_KEYS = ("class_names", "input_shape", "mlflow_run_id", "registered_model_name", "model_version")


class EdgeBuildError(ValueError):
    """The edge model cannot be built from what is in the lake; the message says what to fix."""


@dataclass
class TrainedModel:
    model: object
    size_bytes: int
    info: dict
    class_names: list[str]
    input_shape: tuple[int, int, int]  # height, width, channels


@dataclass(frozen=True)
class EdgeData(EdgeInputs):
    feature_source: str = ""
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass
class EdgeBuildResult:
    uri: str
    ladder: LadderOutcome
    data: EdgeData
    info: dict
    triton_config: str
    mlflow_run_id: str | None

    @property
    def spec(self) -> convert.EdgeModelSpec:
        return self.ladder.shipped.spec

    @property
    def report(self) -> parity.ParityReport:
        return self.ladder.shipped.report


def load_trained_model(lake: Lake, workdir: Path) -> TrainedModel:
    import keras

    base = lake.asset_uri(TRAINED_ASSET)
    model_uri, info_uri = f"{base}/model.keras", f"{base}/model_info.json"
    for uri in (model_uri, info_uri):
        if not lake.exists(uri):
            raise EdgeBuildError(f"{uri} is missing: materialize trained_model first")
    info = json.loads(lake.read_bytes(info_uri))
    missing = [key for key in _INFO_KEYS if key not in info]
    if missing:
        raise EdgeBuildError(f"{info_uri} lacks {missing}; re-materialize trained_model")
    local = workdir / "model.keras"
    local.write_bytes(lake.read_bytes(model_uri))
    model = keras.models.load_model(local, compile=False)
    input_shape = convert.model_input_shape(model)
    class_names = [str(name) for name in info["class_names"]]
    return TrainedModel(model, local.stat().st_size, info, class_names, input_shape)


def _dataset(lake: Lake, files: list[str]):
    import pyarrow.dataset as pads

    return pads.dataset(files, filesystem=lake.fs, format="parquet")


def _feature_files(lake: Lake, info: dict) -> tuple[list[str], str]:
    """The image_features snapshot trained_model used while it is kept, else today's table."""
    recorded, paths = info.get("feature_snapshot_id"), []
    try:
        paths = list(lake.tables.snapshot("image_features", int(recorded)).paths) if recorded else []
    except LookupError:  # expired by lake maintenance
        pass
    if paths:
        return paths, f"the image_features snapshot trained_model used ({recorded})"
    current = list(lake.tables.snapshot("image_features").paths)
    if not current:
        raise EdgeBuildError("image_features holds no Parquet files: materialize image_features first")
    note = "current image_features partitions"
    if recorded:
        note += " (the snapshot trained_model used was expired since)"
    return current, note


def most_common_size(widths: list, heights: list) -> tuple[int, int]:
    sizes = Counter((int(h), int(w)) for h, w in zip(heights, widths) if h and w)
    if not sizes:
        raise EdgeBuildError("raw_images has no valid images with a size: cannot choose the edge raw size")
    return sizes.most_common(1)[0][0]


def load_edge_data(lake: Lake, trained: TrainedModel, settings: EdgeModelConfig, split: str = "test") -> EdgeData:
    """Calibration images and the images parity is judged on: `split`'s (the test split; a sensitivity study
    chooses on the validation split and judges on the test split)."""
    import pyarrow.dataset as pads

    raw_files = list(lake.tables.snapshot("raw_images").paths)
    if not raw_files:
        raise EdgeBuildError("raw_images holds no Parquet files: the edge model is calibrated and tested on them")
    raw = _dataset(lake, raw_files)
    valid = pads.field("status") == "valid"
    index = raw.to_table(columns=["sha256", "split", "width", "height"], filter=valid).to_pylist()
    if settings.raw_height and settings.raw_width:
        raw_size = (settings.raw_height, settings.raw_width)
    elif settings.raw_height or settings.raw_width:
        raise EdgeBuildError("set both raw_height and raw_width, or neither (then the most common image size is used)")
    else:
        raw_size = most_common_size([r["width"] for r in index], [r["height"] for r in index])

    # Deterministic samples: rows ordered by content hash, which is as good as random and stable.
    calibration_ids = sorted({r["sha256"] for r in index if r["split"] == settings.representative_split})
    calibration_ids = calibration_ids[: settings.representative_samples]

    feature_files, feature_source = _feature_files(lake, trained.info)
    test_filter = (pads.field("split") == split) & (pads.field("feature_status") == "ok")
    features = (
        _dataset(lake, feature_files)
        .to_table(columns=["sha256", "label", "tensor", "tensor_shape"], filter=test_filter)
        .to_pylist()
    )
    features = list({row["sha256"]: row for row in sorted(features, key=lambda r: r["sha256"])}.values())
    if settings.max_test_images:
        features = features[: settings.max_test_images]

    wanted = set(calibration_ids) | {row["sha256"] for row in features}
    contents = {}
    for row in raw.to_table(columns=["sha256", "content"], filter=valid & pads.field("sha256").isin(sorted(wanted))).to_pylist():
        contents.setdefault(row["sha256"], row["content"])

    height, width, channels = trained.input_shape
    skipped: Counter = Counter()

    def decoded(sha: str) -> np.ndarray | None:
        try:
            return convert.decode_to_raw(contents[sha], raw_size[0], raw_size[1], channels)
        except Exception:  # a file raw_images called valid but this decoder refuses: count it, go on
            skipped["undecodable"] += 1
            return None

    representative = [image for image in map(decoded, calibration_ids) if image is not None]
    test_raw, test_features, test_labels = [], [], []
    for row in features:
        if row["label"] not in trained.class_names:
            skipped["label_not_in_model"] += 1
            continue
        if row["sha256"] not in contents:
            skipped["no_raw_image"] += 1
            continue
        if tuple(row["tensor_shape"]) != (height, width, channels):
            skipped["feature_shape_mismatch"] += 1
            continue
        image = decoded(row["sha256"])
        if image is None:
            continue
        test_raw.append(image)
        test_features.append(np.frombuffer(row["tensor"], np.uint8).reshape(height, width, channels))
        test_labels.append(trained.class_names.index(row["label"]))
    if not test_raw:
        raise EdgeBuildError(
            f"no {split} image is in both raw_images and image_features ({dict(skipped)} skipped): "
            "materialize image_features for the ingested batches"
        )
    if settings.quantization in (convert.AUTO, "int8") and not representative:
        raise EdgeBuildError(f"no valid {settings.representative_split!r} images in raw_images to calibrate int8 on")
    return EdgeData(
        raw_size=raw_size,
        representative=representative,
        test_raw=np.stack(test_raw),
        test_features=np.stack(test_features),
        test_labels=np.asarray(test_labels),
        feature_source=feature_source,
        skipped=dict(skipped),
    )


def _upload_tree(lake: Lake, local_dir: Path, target_uri: str) -> None:
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        lake.write_bytes(posixpath.join(target_uri, path.relative_to(local_dir).as_posix()), path.read_bytes())


def log_to_mlflow(tracking_uri: str, run_id: str, local_dir: Path, ladder: LadderOutcome, uri: str) -> None:
    """The .tflite, its contract and figures, and every format the ladder tried, on trained_model's own run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    for name in (MODEL_FILE, CONTRACT_FILE, PARITY_FILE, "parity.png"):
        client.log_artifact(run_id, str(local_dir / name), artifact_path=MLFLOW_ARTIFACT_DIR)
    for key, value in ladder.shipped.report.to_dict().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            client.log_metric(run_id, f"edge_{key}", float(value))
    for trial in ladder.trials:
        for key in ("accuracy", "agreement", "negative_flip_rate", "size_ratio", "latency_ratio"):
            value = trial.summary()[key]
            if np.isfinite(value):
                client.log_metric(run_id, f"edge_{trial.format}_{key}", float(value))
    client.set_tag(run_id, "dgx.edge_model.uri", uri)
    client.set_tag(run_id, "dgx.edge_model.format", ladder.shipped.format)
    client.set_tag(run_id, "dgx.edge_model.format_reason", ladder.reason[:5000])
    client.set_tag(run_id, "dgx.edge_model.formats_tried", ",".join(trial.format for trial in ladder.trials))


def edge_contract(shipped: FormatTrial, data: EdgeData, settings: EdgeModelConfig, info: dict, decision: Decision) -> dict:
    """What a device needs to call the model (edge/convert.py), embedded in the .tflite and written beside it."""
    return {
        **shipped.spec.to_dict(),
        "format": shipped.format,
        "raw_height": data.raw_size[0],
        "raw_width": data.raw_size[1],
        "input_scale": settings.input_scale,
        "decision": decision.to_dict(),
        "trained_model": {key: info.get(key) for key in _INFO_KEYS},
    }


def build_edge_model(
    lake: Lake, settings: EdgeModelConfig, tracking_uri: str | None = None, log=lambda message: None
) -> EdgeBuildResult:
    with tempfile.TemporaryDirectory(prefix="edge-model-") as tmp:
        workdir = Path(tmp)
        trained = load_trained_model(lake, workdir)
        data = load_edge_data(lake, trained, settings)
        decision = Decision.from_dict(trained.info.get("decision"))
        log(
            f"Converting trained_model {trained.input_shape} to TFLite ({settings.quantization}), raw input "
            f"{data.raw_size[0]}x{data.raw_size[1]}, {len(data.representative)} calibration images"
        )
        ladder = run_ladder(
            trained.model,
            keras_size_bytes=trained.size_bytes,
            class_names=trained.class_names,
            inputs=data,
            conversion=part_of(settings, convert.ConversionSettings),
            gate=part_of(settings, parity.GateSettings),
            decision=decision,
            latency_images=settings.latency_images,
            num_threads=settings.num_threads,
            log=log,
        )
        log(f"Shipping {ladder.reason}")
        out = workdir / "edge_model"
        out.mkdir()
        contract = edge_contract(ladder.shipped, data, settings, trained.info, decision)
        (out / MODEL_FILE).write_bytes(embed_contract(ladder.shipped.tflite_model, contract))
        (out / CONTRACT_FILE).write_text(json.dumps(contract, indent=2))
        (out / PARITY_FILE).write_text(json.dumps(parity_record(ladder, trained.info, data), indent=2))
        (out / "parity.png").write_bytes(parity.parity_figure(ladder.keras, ladder.shipped.predictions, trained.class_names))
        positive = trained.class_names[decision.positive_index] if decision.positive_index is not None else None
        export = triton.export_triton_repository(
            trained.model,
            out / "triton",
            settings.triton_model_name,
            class_names=trained.class_names,
            max_batch_size=settings.triton_max_batch_size,
            decision=triton.ServingDecision(ladder.shipped.format, decision.threshold, positive),
        )

        staging, final = lake.staging_uri(EDGE_ASSET), lake.asset_uri(EDGE_ASSET)
        _upload_tree(lake, out, staging)
        lake.swap_in(staging, final)
        run_id = trained.info.get("mlflow_run_id")
        if tracking_uri and run_id:
            log_to_mlflow(tracking_uri, run_id, out, ladder, final)
            name, version = trained.info.get("registered_model_name"), trained.info.get("model_version")
            record_edge_model_digest(tracking_uri, run_id, out / MODEL_FILE, name, version)  # what edge-fetch verifies
        return EdgeBuildResult(final, ladder, data, trained.info, export.config_text, run_id if tracking_uri else None)


def parity_record(ladder: LadderOutcome, info: dict, data: EdgeData) -> dict:
    """parity.json: the shipped format's figures (what the blocking check judges), the gate's settings, the ladder."""
    return {
        "report": ladder.shipped.report.to_dict(),
        "gate": ladder.shipped.gate.to_dict(),
        "ladder": ladder.summary(),
        "trained_model": {key: info.get(key) for key in _INFO_KEYS},
        "trained_model_test_metrics": info.get("test_metrics"),
        "feature_source": data.feature_source,
        "skipped": data.skipped,
    }


def read_parity(lake: Lake) -> dict:
    uri = f"{lake.asset_uri(EDGE_ASSET)}/{PARITY_FILE}"
    if not lake.exists(uri):
        raise EdgeBuildError(f"{uri} is missing: materialize edge_model first")
    return json.loads(lake.read_bytes(uri))
