"""trained_model's figures for MLflow: confusion matrix, training curves, ROC (matplotlib, no pyplot state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dgx_assets.training.config import human_epoch

if TYPE_CHECKING:
    from dgx_assets.training.train import TrainingResult


def hunted_class(names: list[str], labels: Any) -> int:
    """The class an inspector looks for, whose ROC curve a two-class model shows: `defective` when there is
    one, else the rarer class of the test labels."""
    import numpy as np

    if "defective" in names:
        return names.index("defective")
    return int(np.argmin(np.bincount(np.asarray(labels, dtype=int), minlength=len(names))))


def figures(result: TrainingResult) -> dict[str, Any]:
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
                ax.plot([human_epoch(e) for e in result.epochs], result.history[prefix + key], marker="o", label=prefix + key)
        if result.best_epoch is not None:  # the weights the model keeps
            best = human_epoch(result.best_epoch)
            ax.axvline(best, color="#c33", linestyle="--", label=f"best epoch ({best})")
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
