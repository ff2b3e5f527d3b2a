"""Model quality by stratified k-fold cross-validation over all 2,624 ELPV images (`make bench-model`).

A single 398-image test split cannot tell 88 % from 90 % (its 95 % interval is about +-3 points). Here every
image is scored once, by the fold model that did not see it, so the pooled accuracy rests on all 2,624.

It runs the product's own path, not a copy of it:
- features: `training.features.compute_features` (what image_features' Spark tasks run) with the recipe's
  `FeatureConfig`, on the ELPV PNG bytes; cached under `.dgx/bench/model_cv/` per feature config;
- training: `training.train.train_classifier` on Parquet files in image_features' layout, one per fold, whose
  `split` column makes fold k the test split and a stratified 15 % of the rest the validation split;
- decisions: `training.decision` (test-time augmentation, the validation-chosen threshold) as trained_model
  applies them;
- edge: `edge.build.ship_edge_model` (the format ladder and the parity gate edge_model runs) on each fold
  model, with calibration images from the fold's training split.

Prints per-fold and pooled accuracy with a 95 % Wilson interval, macro-F1, ROC AUC, the edge format shipped
and its pooled accuracy, and the wall time; writes them to `.dgx/bench/model_cv-<recipe>.json` and logs an
MLflow run in the experiment `dgx_assets_model_cv` (`make mlflow-ui` shows it).

    python -m bench.model_cv                       # the default recipe, 5 folds
    python -m bench.model_cv --recipe dgx          # the DGX recipe (training.config.NAMED_RECIPES)
    python -m bench.model_cv --set epochs=10       # a lever: any TrainConfig field
    python -m bench.model_cv --feature image_height=300 --feature image_width=300
    python -m bench.model_cv --quick               # 240 images, 2 folds, 1 epoch, one fold converted: a smoke run
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.common import REPO, Report, main, work_dir
from dgx_assets.training.decision import VIEW_GROUPS, positive_index

NAME = "model_cv"
EXPERIMENT = "dgx_assets_model_cv"
GOAL_ACCURACY = 0.902  # above the best published ELPV figure we trust (90.1 %, ResNet-152 + GAN oversampling)
SEED = 0
OUTPUT_DIR = REPO / ".dgx" / "bench"


@dataclass
class FoldResult:
    fold: int
    labels: np.ndarray
    probabilities: np.ndarray  # what trained_model reports: its own decision path (TTA if the recipe has it)
    threshold: float | None  # trained_model's own (None unless the recipe tunes it)
    # Per set of dihedral views (VIEW_SETS): the mean test probabilities and the threshold chosen on validation.
    views: dict[str, tuple[np.ndarray, float]]
    validation_labels: np.ndarray
    validation: np.ndarray  # [view, image, class] probabilities of the 8 dihedral views of the validation split
    seconds: float
    best_epoch: int | None
    edge: dict = field(default_factory=dict)


def parse_settings(pairs: list[str]) -> dict:
    """`name=value` pairs; values are read as JSON when they parse (numbers, booleans, lists), else strings."""
    settings = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            settings[name] = json.loads(value)
        except ValueError:
            settings[name] = value
    return settings


def elpv_rows(limit: int | None):
    """ELPV as raw_images rows (PNG bytes, label, size), inspected by the ingest's own `inspect_image`."""
    import pandas as pd

    from dgx_assets.demo_seed import elpv_records
    from dgx_assets.ingest.images import VALID, inspect_image, sha256_hex

    records = elpv_records()
    if limit:  # a stratified-enough subset for smoke runs: every n-th image
        records = records[:: max(1, len(records) // limit)][:limit]
    rows = []
    for record in records:
        content = record["file"].read_bytes()
        verdict = inspect_image(content, record["file"].name)
        if verdict.status != VALID:
            raise RuntimeError(f"{record['file']} is not a valid image: {verdict.reason}")
        rows.append(
            {
                "path": str(record["file"]),
                "batch": "elpv",  # image_features rows carry their landing batch since the Iceberg tables
                "label": record["label"],
                "sha256": sha256_hex(content),
                "width": verdict.width,
                "height": verdict.height,
                "split": "train",
                "content": content,
                "probability": record["probability"],
            }
        )
    return pd.DataFrame(rows)


def feature_table(rows, feature_config, cache: Path):
    """image_features rows for every image, computed once per feature config by the executors' function."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dgx_assets.training.features import FEATURE_SCHEMA, compute_features

    key = hashlib.sha256(json.dumps([feature_config.model_dump(), sorted(rows["sha256"])], sort_keys=True).encode()).hexdigest()[
        :12
    ]
    path = cache / f"features-{key}.parquet"
    if not path.exists():
        started = time.perf_counter()
        parts = [
            pa.Table.from_pandas(
                compute_features(rows.iloc[i : i + 64], feature_config), schema=FEATURE_SCHEMA, preserve_index=False
            )
            for i in range(0, len(rows), 64)
        ]
        pq.write_table(pa.concat_tables(parts), path.with_suffix(".tmp"), compression="zstd")
        path.with_suffix(".tmp").rename(path)
        print(f"features of {len(rows)} images in {time.perf_counter() - started:.0f}s -> {path}", flush=True)
    table = pq.read_table(path)
    failed = table.num_rows - sum(status == "ok" for status in table.column("feature_status").to_pylist())
    if failed:
        raise RuntimeError(f"{failed} ELPV images could not be featurised")
    return table


def fold_splits(labels: np.ndarray, folds: int) -> list[np.ndarray]:
    """Per fold, every image's split: fold k is `test`, a stratified 15 % of the rest `validation`."""
    from sklearn.model_selection import StratifiedKFold, train_test_split

    assignments = []
    outer = StratifiedKFold(n_splits=folds, shuffle=True, random_state=SEED)
    for train_val, test in outer.split(np.zeros(len(labels)), labels):
        _, validation = train_test_split(train_val, test_size=0.15, stratify=labels[train_val], random_state=SEED)
        split = np.full(len(labels), "train", dtype=object)
        split[test], split[validation] = "test", "validation"
        assignments.append(split)
    return assignments


def tensors(table, split_column: np.ndarray, split: str) -> np.ndarray:
    from dgx_assets.training.features import tensor_from_row

    rows = np.flatnonzero(split_column == split)
    tensor, shape = table.column("tensor"), table.column("tensor_shape")
    return np.stack([tensor_from_row(tensor[int(i)].as_py(), shape[int(i)].as_py()) for i in rows])


# Groups of `decision.dihedral_views`' 8 views (the image's 4 quarter turns, then those of its mirror image): what
# each number of views at inference gives, measured on the same fold models. The product's `test_time_views`
# (RECIPE_VIEWS, their groups from decision.VIEW_GROUPS), then the other groups of 2 and 4 views.
RECIPE_VIEWS = {1: "one_view", 2: "two_views_flip", 4: "four_views_turns", 8: "eight_views"}
VIEW_SETS = {name: VIEW_GROUPS[count] for count, name in RECIPE_VIEWS.items()} | {
    "two_views_half_turn": (0, 2),
    "four_views_flips": (0, 4, 2, 6),
}


def view_probabilities(model, images: np.ndarray) -> np.ndarray:
    """[view, image, class] probabilities of the one-view classifier over the 8 dihedral views."""
    from dgx_assets.training import decision

    return np.stack([decision.predict(model, view) for view in decision.dihedral_views(images)])


def run_fold(fold: int, table, split: np.ndarray, train_config, workdir: Path, edge_settings) -> FoldResult:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from dgx_assets.training import decision
    from dgx_assets.training.dataset import FeatureFiles
    from dgx_assets.training.model import single_view
    from dgx_assets.training.train import train_classifier

    path = workdir / f"fold-{fold}.parquet"
    fold_table = table.set_column(table.schema.get_field_index("split"), "split", pa.array(split.tolist()))
    # The experts' grade (0, 1/3, 2/3, 1): what `--set soft_targets=defect_probability` trains on.
    grades = pa.array([PROBABILITY[sha] for sha in table.column("sha256").to_pylist()], pa.float32())
    pq.write_table(fold_table.append_column("defect_probability", grades), path)
    started = time.perf_counter()
    result = train_classifier(FeatureFiles(pafs.LocalFileSystem(), (str(path),)), train_config, str(workdir / f"ckpt-{fold}"))
    seconds = time.perf_counter() - started
    names = result.class_names
    ids = {name: i for i, name in enumerate(names)}
    labels_of = lambda which: np.array([ids[v] for v in np.asarray(table.column("label"))[split == which]])  # noqa: E731
    test_images, validation_images = tensors(table, split, "test"), tensors(table, split, "validation")
    positive = decision.positive_index(names)
    base = single_view(result.model)  # the ablation averages the views of the one-view classifier
    validation, test = view_probabilities(base, validation_images), view_probabilities(base, test_images)
    views = {}
    for name, subset in VIEW_SETS.items():
        threshold = decision.choose_threshold(labels_of("validation"), validation[list(subset)].mean(0), positive)
        views[name] = (test[list(subset)].mean(0), threshold)
    recipe = result.decision
    probabilities = views[RECIPE_VIEWS[recipe.views]][0]
    np.savez(workdir.parent / f"fold-{fold}-predictions.npz", labels=labels_of("test"), validation=validation, test=test)
    result.model.save(workdir.parent / f"fold-{fold}.keras")
    edge = {}
    if edge_settings is not None:
        edge = fold_edge(result, table, split, test_images, labels_of("test"), edge_settings, workdir)
    return FoldResult(
        fold,
        labels_of("test"),
        probabilities,
        recipe.threshold,
        views,
        labels_of("validation"),
        validation,
        seconds,
        result.best_epoch,
        edge,
    )


def fold_edge(result, table, split, test_images, test_labels, settings, workdir: Path) -> dict:
    """The product's format ladder on this fold's model: calibration from its training split, parity on its test split."""
    from dgx_assets.edge.convert import ConversionSettings, decode_to_raw
    from dgx_assets.edge.ladder import EdgeInputs, run_ladder
    from dgx_assets.edge.parity import GateSettings

    shas = np.asarray(table.column("sha256"))
    height, width, channels = 300, 300, result.input_shape[2]  # ELPV's cells: the edge raw size

    def raw(sha: str) -> np.ndarray:
        return decode_to_raw(RAW_CONTENT[sha], height, width, channels)

    model_path = workdir / "fold-model.keras"
    result.model.save(model_path)
    outcome = run_ladder(
        result.model,
        keras_size_bytes=model_path.stat().st_size,
        class_names=result.class_names,
        inputs=EdgeInputs(
            raw_size=(height, width),
            representative=[raw(sha) for sha in sorted(shas[split == "train"])[: settings.representative_samples]],
            test_raw=np.stack([raw(sha) for sha in shas[split == "test"]]),
            test_features=test_images,
            test_labels=test_labels,
        ),
        conversion=ConversionSettings(**settings.model_dump(include=set(ConversionSettings.model_fields))),
        gate=GateSettings(**settings.model_dump(include=set(GateSettings.model_fields))),
        decision=result.decision,
        latency_images=20,
    )
    return outcome.summary()


RAW_CONTENT: dict[str, bytes] = {}
PROBABILITY: dict[str, float] = {}  # ELPV's expert defect probability per image


POSITIVE = positive_index(("defective", "functional"))  # ELPV's classes, as trained_model orders them


def pooled(
    results: list[FoldResult], views: str | None = None, tuned: bool = True, thresholds: list[float] | None = None
) -> dict:
    """Pooled figures of one decision path: trained_model's own, or the mean over the view set `views` at each
    fold's validation threshold (`tuned`), at argmax, or at the given per-fold `thresholds`."""
    from dgx_assets.training import decision
    from dgx_assets.training.train import wilson_interval

    labels = np.concatenate([r.labels for r in results])
    paths = [(r.probabilities, r.threshold) if views is None else r.views[views] for r in results]
    if thresholds is not None:
        paths = [(p, threshold) for (p, _), threshold in zip(paths, thresholds)]
    decided = np.concatenate([decision.decide(p, threshold if tuned else None, POSITIVE) for p, threshold in paths])
    probabilities = np.concatenate([p for p, _ in paths])
    from sklearn.metrics import f1_score, roc_auc_score

    correct = int((decided == labels).sum())
    low, high = wilson_interval(correct, len(labels))
    return {
        "accuracy": correct / len(labels),
        "ci95": [low, high],
        "macro_f1": float(f1_score(labels, decided, average="macro")),
        "roc_auc": float(roc_auc_score(labels == POSITIVE, probabilities[:, POSITIVE])),
        "images": len(labels),
    }


def run(report: Report, args) -> None:
    import pyarrow.compute as pc

    from dgx_assets.training.config import NAMED_RECIPES, FeatureConfig, TrainConfig

    started = time.perf_counter()
    feature_config = FeatureConfig(**parse_settings(args.feature))
    # The recipe, one epoch for a smoke run, then any --set lever on top.
    overrides = NAMED_RECIPES[args.recipe] | ({"epochs": 1} if args.quick else {}) | parse_settings(args.set)
    train_config = TrainConfig(**overrides)  # a wrong setting is refused here, named
    folds = 2 if args.quick else args.folds
    cache = work_dir(NAME)
    rows = elpv_rows(240 if args.quick else None)
    RAW_CONTENT.update(zip(rows["sha256"], rows["content"]))
    PROBABILITY.update(zip(rows["sha256"], rows["probability"]))
    table = feature_table(rows, feature_config, cache)
    labels = np.asarray(pc.equal(table.column("label"), "defective"), dtype=int)
    edge_settings = None
    if not args.no_edge:
        from dgx_assets.edge.config import EdgeModelConfig

        edge_settings = EdgeModelConfig()
    report.params.update(
        {
            "folds": folds,
            "images": len(labels),
            "features": feature_config.model_dump(),
            "train": train_config.resolved().model_dump(),
        }
    )
    results = []
    runs = cache / (args.label or "runs")
    runs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="model-cv-", dir=runs) as tmp:
        for fold, split in enumerate(fold_splits(labels, folds)):
            # A smoke run converts one fold's model: the ladder's int8 calibration is most of a fold's time.
            fold_edge = edge_settings if fold == 0 or not args.quick else None
            results.append(run_fold(fold, table, split, train_config, Path(tmp), fold_edge))
            r = results[-1]
            print(f"fold {fold}: {np.mean(r.probabilities.argmax(1) == r.labels):.4f} ({r.seconds:.0f}s) {r.edge}", flush=True)
    summarise(report, results, train_config, feature_config, time.perf_counter() - started, args)


def threshold_ablation(results: list[FoldResult], name: str) -> dict:
    """Two steadier thresholds for the view set `name` than each fold's own validation choice: one threshold
    chosen on every fold's validation images pooled (still no test image seen), and each fold's shrunk halfway
    toward 0.5."""
    from dgx_assets.training import decision

    subset = list(VIEW_SETS[name])
    labels = np.concatenate([r.validation_labels for r in results])
    probabilities = np.concatenate([r.validation[subset].mean(0) for r in results])
    shared = decision.choose_threshold(labels, probabilities, POSITIVE)
    return {
        f"{name}_pooled_validation_threshold": pooled(results, name, thresholds=[shared] * len(results)) | {"threshold": shared},
        f"{name}_threshold_shrunk_to_half": pooled(
            results, name, thresholds=[decision.shrink_toward_half(r.views[name][1], 0.5) for r in results]
        ),
    }


def summarise(report: Report, results: list[FoldResult], train_config, feature_config, wall_s: float, args) -> None:
    figures = pooled(results)
    recipe_views = RECIPE_VIEWS[train_config.test_time_views]
    # At 0.5 too for the recipe's own views: the far end of threshold_ablation's shrinkage.
    argmax_views = dict.fromkeys(("one_view", recipe_views, "eight_views"))
    ablation = {f"{name}_argmax": pooled(results, name, tuned=False) for name in argmax_views}
    ablation |= {f"{name}_threshold": pooled(results, name) for name in VIEW_SETS}
    ablation |= threshold_ablation(results, recipe_views)
    edge = [r.edge for r in results if r.edge]
    formats = sorted({e["format"] for e in edge})
    edge_accuracy = sum(e["edge_correct"] for e in edge) / sum(e["images"] for e in edge) if edge else None
    record = {
        "pooled_accuracy": figures["accuracy"],
        "pooled_accuracy_ci95": figures["ci95"],
        "macro_f1": figures["macro_f1"],
        "roc_auc": figures["roc_auc"],
        "folds": [
            {
                "fold": r.fold,
                "images": len(r.labels),
                "accuracy": pooled([r])["accuracy"],
                "threshold": r.threshold,
                "thresholds_chosen": {name: threshold for name, (_, threshold) in r.views.items()},
                "best_epoch": r.best_epoch,
                "seconds": round(r.seconds, 1),
                "edge": r.edge,
            }
            for r in results
        ],
        "ablation": ablation,
        "recipe": {
            "name": args.recipe,
            "train": train_config.resolved().model_dump(),
            "features": feature_config.model_dump(),
            "label": args.label,
        },
        "edge_format": formats[0] if len(formats) == 1 else formats,
        "edge_pooled_accuracy": edge_accuracy,
        "edge_folds": len(edge),
        "wall_s": round(wall_s, 1),
        "quick": bool(args.quick),
    }
    out = Path(args.output or OUTPUT_DIR / f"model_cv-{args.recipe}{'.quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=float) + "\n")
    for r in record["folds"]:
        print(f"fold {r['fold']}: accuracy {r['accuracy']:.4f} on {r['images']} images, {r['seconds']:.0f} s")
    low, high = figures["ci95"]
    print(f"pooled: accuracy {figures['accuracy']:.4f} (95 % {low:.4f}-{high:.4f}), ", end="")
    print(f"macro-F1 {figures['macro_f1']:.4f}, AUC {figures['roc_auc']:.4f}")
    for name, values in ablation.items():
        print(f"  {name}: {values['accuracy']:.4f}")
    print(f"edge: {record['edge_format']} pooled accuracy {edge_accuracy} over {len(edge)} fold(s); ", end="")
    print(f"wall {wall_s:.0f} s; wrote {out}")
    report.figure("model_cv", record)
    log_to_mlflow(record)
    report.result(
        "model_cv_pooled_accuracy",
        round(figures["accuracy"], 4),
        ">=",
        GOAL_ACCURACY,
        f"{len(results)} folds, Wilson 95 % interval",
        interval=tuple(figures["ci95"]),
        rounds=figures["images"],
    )


def log_to_mlflow(record: dict) -> None:
    import mlflow

    from dgx_assets import settings
    from dgx_assets.tracking.store import default_artifact_location

    uri = settings.environment().mlflow_tracking_uri
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:  # artifacts beside the store, not in ./mlruns
        mlflow.create_experiment(EXPERIMENT, artifact_location=default_artifact_location(uri))
    experiment = mlflow.set_experiment(EXPERIMENT)
    mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, "mlflow.experimentKind", "custom_model_development")
    with mlflow.start_run(run_name=record["recipe"]["label"] or f"model_cv {record['recipe']['name']}"):
        mlflow.log_params({f"train.{k}": v for k, v in record["recipe"]["train"].items()})
        mlflow.log_params({f"features.{k}": v for k, v in record["recipe"]["features"].items()})
        mlflow.log_metrics(
            {
                "pooled_accuracy": record["pooled_accuracy"],
                "pooled_accuracy_ci95_low": record["pooled_accuracy_ci95"][0],
                "pooled_accuracy_ci95_high": record["pooled_accuracy_ci95"][1],
                "macro_f1": record["macro_f1"],
                "roc_auc": record["roc_auc"],
                "wall_s": record["wall_s"],
                **(
                    {"edge_pooled_accuracy": record["edge_pooled_accuracy"]} if record["edge_pooled_accuracy"] is not None else {}
                ),
                **{f"{name}_accuracy": values["accuracy"] for name, values in record["ablation"].items()},
            }
        )
        mlflow.log_dict(record, "model_cv.json")


def add_arguments(cli) -> None:
    from dgx_assets.training.config import NAMED_RECIPES

    cli.add_argument("--recipe", choices=sorted(NAMED_RECIPES), default="default", help="the trained_model recipe measured")
    cli.add_argument("--folds", type=int, default=5, help="stratified folds (default 5)")
    cli.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a TrainConfig field (repeatable)")
    cli.add_argument("--feature", action="append", default=[], metavar="FIELD=VALUE", help="a FeatureConfig field (repeatable)")
    cli.add_argument("--no-edge", action="store_true", help="skip the edge format ladder on each fold model")
    cli.add_argument("--label", default="", help="a name for this recipe in the JSON and the MLflow run")
    cli.add_argument("--output", default=None, help=f"the JSON written (default {OUTPUT_DIR}/model_cv-<recipe>[.quick].json)")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
