"""Charts for the quality report, as PNG bytes (matplotlib, no display needed)."""

from __future__ import annotations

import io

YARDSTICKS = {"SVM on hand-crafted features": 0.824, "fine-tuned VGG-19 (GPU)": 0.884}  # Deitsch et al., 2019


def _png(figure) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def _figure(width=6.0, height=3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def ingestion_bars(batches: dict[str, dict]) -> bytes:
    """Stacked bars per batch: valid files and each quarantine reason."""
    figure, axes = _figure()
    names = list(batches)
    reasons = sorted({reason for summary in batches.values() for reason in summary["quarantined"]})
    bottom = [0] * len(names)
    for label, values in [("valid", [batches[n]["valid"] for n in names])] + [
        (reason, [batches[n]["quarantined"].get(reason, 0) for n in names]) for reason in reasons
    ]:
        axes.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes.set_ylabel("files")
    axes.set_title("Files per landing batch")
    axes.legend(fontsize=8)
    return _png(figure)


def statistic_boxes(per_batch: dict[str, list[float]], reference: list[float], name: str) -> bytes:
    figure, axes = _figure()
    labels = ["training data"] + list(per_batch)
    axes.boxplot([reference] + [per_batch[b] for b in per_batch], showfliers=False)
    axes.set_xticks(range(1, len(labels) + 1), labels, rotation=20, fontsize=8)
    axes.set_title(f"Image {name} per batch against the training data")
    return _png(figure)


def accuracy_bars(accuracy: float, baseline: float | None, edge_accuracy: float | None) -> bytes:
    figure, axes = _figure()
    bars = {"majority baseline": baseline, "trained_model": accuracy, "edge_model (TFLite)": edge_accuracy}
    bars |= YARDSTICKS
    shown = {k: v for k, v in bars.items() if v is not None}
    axes.barh(list(shown), [v * 100 for v in shown.values()], color=["#999", "#2a7", "#27a", "#c93", "#c63"][: len(shown)])
    for index, value in enumerate(shown.values()):
        axes.text(value * 100 + 0.5, index, f"{value:.1%}", va="center", fontsize=8)
    axes.set_xlim(0, 105)
    axes.set_xlabel("test accuracy (%)")
    axes.set_title("Test accuracy against the baseline and the published yardsticks")
    return _png(figure)


def confusion_heatmap(matrix: list[list[int]], class_names: list[str]) -> bytes:
    figure, axes = _figure(4.0, 3.4)
    image = axes.imshow(matrix, cmap="Blues")
    axes.set_xticks(range(len(class_names)), class_names)
    axes.set_yticks(range(len(class_names)), class_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    darkest = max((count for row in matrix for count in row), default=0)
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            # White on the dark cells: black on navy cannot be read.
            axes.text(j, i, str(count), ha="center", va="center", color="white" if count > darkest / 2 else "black")
    figure.colorbar(image)
    axes.set_title("Confusion matrix (test split)")
    return _png(figure)


def training_curves(history: dict[str, list[tuple[int, float]]], best_epoch: int | None = None) -> bytes:
    figure, axes = _figure()
    for key, points in sorted(history.items()):
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
    if best_epoch is not None:  # the weights the model keeps (early stopping restores them)
        axes.axvline(best_epoch, color="#c33", linestyle="--", label=f"best epoch ({best_epoch})")
    axes.set_xlabel("epoch")
    axes.set_title("Training curves")
    axes.legend(fontsize=8)
    return _png(figure)


def label_shares(batches: dict[str, dict]) -> bytes:
    """Stacked bars: each batch's share of every class among its valid images."""
    figure, axes = _figure()
    names = list(batches)
    classes = sorted({label for summary in batches.values() for label in summary.get("labels", {})})
    bottom = [0.0] * len(names)
    for label in classes:
        shares = [100 * batches[n]["labels"].get(label, 0) / max(1, sum(batches[n]["labels"].values())) for n in names]
        bars = axes.bar(names, shares, bottom=bottom, label=label)
        axes.bar_label(bars, labels=[f"{v:.0f} %" for v in shares], label_type="center", fontsize=8)
        bottom = [b + v for b, v in zip(bottom, shares)]
    axes.set_ylabel("share of valid images (%)")
    axes.set_title("Label balance per batch")
    axes.legend(fontsize=8)
    return _png(figure)
