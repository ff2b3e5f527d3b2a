"""int8 layer sensitivity on the demo's model: the fewest layers that, kept in float, bring int8 through the gate.

The method accuracy-aware quantization tools use (Intel Neural Compressor's tuning, OpenVINO's accuracy-aware
quantization), through the product's own converter (`edge.convert.convert_to_tflite` with `float_layers`) and
parity gate (`edge.parity`):

1. full-integer int8, judged against trained_model on the validation split;
2. each layer group alone kept in float (the stem, each stage of blocks or each block, the head), judged on the
   validation split: the negative flips it saves are its sensitivity;
3. the groups added to the float set one at a time, most sensitive first, until the gate passes on the
   validation split (at most --max-groups);
4. that set (or the last one tried, when none passes) judged once on the test split, with the gate's own
   criteria, and its file size against the float32 weights' (issue 43's goal: at most 0.35).

Choosing on validation and judging on test keeps the test split out of the choice. Calibration is edge_model's:
its `representative_samples` training images, ordered by content hash.

    python -m bench.int8_sensitivity                    # after `make demo`: trained_model and raw_images of the lake
    python -m bench.int8_sensitivity --groups blocks    # one group per block (16 for Lite0) instead of per stage
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from bench.common import Report, main

NAME = "int8_sensitivity"
SIZE_GOAL = 0.35  # of the float32 weights: a full-integer network is about a quarter, plus its activations' tables


def layer_groups(model, per: str) -> dict[str, list[str]]:
    """Float-layer prefixes per group of the EfficientNet-Lite backbone inside `model`: stem, stages or blocks, head."""
    from dgx_assets.backbones.efficientnet_lite import VARIANTS, block_name
    from dgx_assets.training.model import single_view

    (variant,) = [VARIANTS[layer.name] for layer in single_view(model).layers if layer.name in VARIANTS]
    groups, first = {"stem": ["stem_"]}, 0
    for number, stage in enumerate(variant.stages):
        blocks = [f"{block_name(index)}_" for index in range(first, first + stage.repeats)]
        if per == "blocks":
            groups |= {prefix.rstrip("_"): [prefix] for prefix in blocks}
        else:
            groups[f"stage{number}"] = blocks
        first += stage.repeats
    groups["head"] = ["head_"]
    return groups


def run(report: Report, args) -> None:
    from dgx_assets import settings
    from dgx_assets.edge import parity
    from dgx_assets.edge.build import load_edge_data, load_trained_model
    from dgx_assets.edge.config import EdgeModelConfig
    from dgx_assets.edge.convert import EdgeConversionConfig, convert_to_tflite
    from dgx_assets.gates import Gate
    from dgx_assets.lake.store import Lake
    from dgx_assets.training.decision import Decision, positive_index
    from dgx_assets.training.model import single_view

    lake = Lake(args.lake or settings.environment().lake_root)
    edge_settings = EdgeModelConfig()
    gate = parity.GateSettings(**edge_settings.model_dump(include=set(parity.GateSettings.model_fields)))
    with tempfile.TemporaryDirectory(prefix="int8-sensitivity-") as tmp:
        trained = load_trained_model(lake, Path(tmp))
    model, classes = trained.model, trained.class_names
    decision = Decision.from_dict(trained.info.get("decision", {}))
    threshold, positive = decision.threshold, positive_index(classes)
    splits = {split: load_edge_data(lake, trained, edge_settings, split) for split in ("validation", "test")}
    raw_height, raw_width = splits["test"].raw_size
    float32_weights = 4 * single_view(model).count_params()
    reference = {split: parity.keras_predict(model, data.test_features, latency_images=0) for split, data in splits.items()}
    report.params.update(
        images={split: len(data.test_labels) for split, data in splits.items()},
        calibration=len(splits["test"].representative),
        float32_weights_bytes=float32_weights,
        groups=args.groups,
    )

    def judged(float_layers: list[str], split: str) -> tuple[parity.ParityReport, Gate, int]:
        config = EdgeConversionConfig(
            quantization="int8",
            raw_height=raw_height,
            raw_width=raw_width,
            representative_samples=edge_settings.representative_samples,
            float_layers=float_layers,
        )
        data = splits[split]
        blob = convert_to_tflite(model, config, data.representative)
        edge = parity.tflite_predict(blob, data.test_raw)
        figures = parity.compare(
            reference[split],
            edge,
            data.test_labels,
            quantization="int8",
            keras_size_bytes=trained.size_bytes,
            tflite_size_bytes=len(blob),
            threshold=threshold,
            positive=positive,
        )
        return figures, parity.evaluate_gate(figures, gate), len(blob)

    def row(name: str, figures: parity.ParityReport, verdict: Gate, size: int) -> dict:
        line = {
            "negative_flips": figures.negative_flips,
            "negative_flip_rate": round(figures.negative_flip_rate, 4),
            "accuracy_drop_points": round((figures.keras_accuracy - figures.tflite_accuracy) * 100, 2),
            "gate_passed": verdict.passed,
            "size_vs_float32_weights": round(size / float32_weights, 3),
        }
        print(f"  {name}: {line}", flush=True)
        return line

    print(f"validation {len(splits['validation'].test_labels)} images, test {len(splits['test'].test_labels)}")
    full = row("full-integer (validation)", *judged([], "validation"))
    groups = layer_groups(model, args.groups)
    alone = {name: row(f"{name} in float (validation)", *judged(prefixes, "validation")) for name, prefixes in groups.items()}
    report.figure("validation_full_integer", full)
    report.figure("validation_one_group_in_float", alone)
    # Sensitivity: the negative flips a group saves when it alone stays in float (ties: the smaller accuracy drop).
    ranked = sorted(alone, key=lambda name: (alone[name]["negative_flips"], alone[name]["accuracy_drop_points"]))
    chosen: list[str] = []
    passed = full["gate_passed"]
    for name in ranked[: args.max_groups]:
        if passed:
            break
        chosen.append(name)
        if len(chosen) == 1:
            line = alone[name]  # measured above
        else:
            line = row(f"float: {', '.join(chosen)} (validation)", *judged([p for g in chosen for p in groups[g]], "validation"))
        passed = line["gate_passed"]
        report.figure(f"validation_float_{len(chosen)}_groups", {"groups": list(chosen), **line})
    if not passed:  # a finding, not a failure: the test split's figures say how far int8 stays from the gate
        report.note(f"no set of up to {args.max_groups} groups kept in float passed the gate on the validation split")
    figures, verdict, size = judged([p for g in chosen for p in groups[g]], "test")
    final = row(f"chosen ({', '.join(chosen) or 'full-integer'}) on the test split", figures, verdict, size)
    report.figure("test_chosen", {"groups": chosen, **final, "criteria": [dataclasses.asdict(c) for c in verdict.criteria]})
    report.result(
        "int8_test_negative_flip_rate_pct", round(100 * figures.negative_flip_rate, 3), "<=", 100 * gate.max_negative_flip_rate
    )
    report.result("int8_size_vs_float32_weights", round(size / float32_weights, 4), "<=", SIZE_GOAL)
    report.result(
        "int8_test_gate_passed", float(verdict.passed), ">=", 1.0, "1: the gate's three criteria hold on the test split"
    )


def add_arguments(cli) -> None:
    cli.add_argument("--lake", default=None, help="the lake holding trained_model and raw_images (default: DGX_LAKE_ROOT)")
    cli.add_argument("--groups", choices=("stages", "blocks"), default="stages", help="layer groups measured")
    cli.add_argument("--max-groups", type=int, default=4, help="most groups kept in float before giving up")


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments, repeats=1))
