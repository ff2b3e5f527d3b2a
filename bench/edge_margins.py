"""Where edge models disagree with trained_model: the measurement behind the parity gate's `confident_margin`.

For each cross-validation fold model that `bench.model_cv` saved, every image of the fold's test split is run
through trained_model and through edge models made by the product's ladder: full-integer int8 (quantization
noise), and two broken edge paths (pixels normalised twice, `input_scale` 1/255; nearest-neighbour resizing
instead of image_features' antialiased one). For each, the Keras decision margin of every disagreement
(2|P(defective) - 0.5|) is recorded. A good `confident_margin` sits above every int8 disagreement and below
most of the broken paths'.

    python -m bench.edge_margins --models .dgx/bench/model_cv/<label>    # after python -m bench.model_cv --label <label>
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bench.common import Report, main, work_dir
from bench.model_cv import RAW_CONTENT, elpv_rows, feature_table, fold_splits, tensors

NAME = "edge_margins"
VARIANTS = {
    "int8": {"quantization": "int8"},
    "normalised_twice": {"quantization": "float32", "input_scale": 1 / 255},
    "nearest_resize": {"quantization": "float32", "resize_method": "nearest"},
}


def fold_margins(model_path: Path, table, split: np.ndarray) -> dict[str, list[float]]:
    import keras
    import pyarrow.compute as pc

    from dgx_assets.edge.convert import ConversionSettings, decode_to_raw
    from dgx_assets.edge.ladder import EdgeInputs, run_ladder
    from dgx_assets.edge.parity import GateSettings

    model = keras.models.load_model(model_path, compile=False)
    shas = np.asarray(table.column("sha256"))
    labels = np.asarray(pc.equal(table.column("label"), "functional"), dtype=int)  # class order: defective, functional
    raw = lambda sha: decode_to_raw(RAW_CONTENT[sha], 300, 300, 1)  # noqa: E731
    inputs = EdgeInputs(
        raw_size=(300, 300),
        representative=[raw(sha) for sha in sorted(shas[split == "train"])[:200]],
        test_raw=np.stack([raw(sha) for sha in shas[split == "test"]]),
        test_features=tensors(table, split, "test"),
        test_labels=labels[split == "test"],
    )
    margins = {}
    for name, settings in VARIANTS.items():
        outcome = run_ladder(
            model,
            keras_size_bytes=model_path.stat().st_size,
            class_names=["defective", "functional"],
            inputs=inputs,
            conversion=ConversionSettings(**settings),
            gate=GateSettings(),
            latency_images=1,
        )
        margins[name] = outcome.shipped.report.disagreement_margins
        print(f"{model_path.name} {name}: {len(margins[name])} disagreements, margins {margins[name][:8]}", flush=True)
    return margins


def run(report: Report, args) -> None:
    import pyarrow.compute as pc

    from dgx_assets.training.config import FeatureConfig

    models = sorted(Path(args.models).glob("fold-*.keras"))
    if not models:
        raise SystemExit(f"no fold-*.keras in {args.models}: run python -m bench.model_cv --label <label> first")
    rows = elpv_rows(None)
    RAW_CONTENT.update(zip(rows["sha256"], rows["content"]))
    table = feature_table(rows, FeatureConfig(), work_dir("model_cv"))
    splits = fold_splits(np.asarray(pc.equal(table.column("label"), "defective"), dtype=int), len(models))
    pooled: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for path, split in zip(models, splits):
        for name, values in fold_margins(path, table, split).items():
            pooled[name] += values
    images = len(rows)
    for name, values in pooled.items():
        values = sorted(values, reverse=True)
        above = {f">= {m}": sum(v >= m for v in values) for m in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8)}
        print(f"{name}: {len(values)} disagreements of {images} images; largest margin {max(values, default=0):.3f}; {above}")
        report.figure(name, {"disagreements": len(values), "margins": [round(v, 4) for v in values], "above": above})
    int8_max = max(pooled["int8"], default=0.0)
    report.result("edge_int8_largest_disagreement_margin", round(int8_max, 4), "<=", 0.5, "over every fold's test split")


def add_arguments(cli) -> None:
    cli.add_argument("--models", required=True, help="the folder bench.model_cv saved its fold-*.keras in")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
