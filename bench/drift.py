"""Embedding drift: the drift check on 10,000 batch embeddings against 10,000 training ones (1,280 dims).

Project: `dgx_assets.production.drift.judge_embedding_drift` with its defaults (each side subsampled to 2,000
rows, PCA to 32 whitened components, leave-one-out least squares, 999 label permutations for the p-value).

Baseline: Evidently's default embedding-drift method written out in scikit-learn (what its `model` method runs):
a 50/50 `train_test_split` of the pooled rows, `SGDClassifier(loss="log_loss")` on the raw 1,280 dims, the
held-out ROC AUC, drift when it is over 0.55. No p-value.

Inputs: synthetic embeddings shaped like the backbone's (a mean, 16 latent factors of decreasing weight, noise),
a current set drawn like the reference and one whose first factor moved by one of its standard deviations. Before
timing, both sides must call the first no drift and the second drift. Goals: the project's check at most 5 s on
10,000 x 10,000 (median of the rounds, interval min-max), and at least as fast as the baseline. Then the
statistics at line size, 60-image batches against a 2,000-row reference: the false-alarm rate over 400 batches
drawn like the reference (goal at most 0.02 at alpha 0.01) and the power on 100 shifted batches (goal at least
0.9), each with its Wilson 95 % interval. Quick: 2,000 x 2,000, 50 batches of each kind.
"""

from __future__ import annotations

import sys

import numpy as np

from bench.common import Report, check, interleaved, main
from tests.support.synthetic_embeddings import BATCH, DIMS, Source

NAME = "drift"


def evidently_model_method(reference: np.ndarray, current: np.ndarray) -> tuple[float, bool]:
    """Evidently's `model` drift method, step for step: held-out ROC AUC of an SGD logistic classifier > 0.55."""
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split

    rows = np.concatenate([reference, current])
    sides = np.r_[np.ones(len(reference)), np.zeros(len(current))]
    x_train, x_test, y_train, y_test = train_test_split(rows, sides, test_size=0.5, random_state=42, shuffle=True)
    classifier = SGDClassifier(loss="log_loss", random_state=42).fit(x_train, y_train)
    auc = float(roc_auc_score(y_test, classifier.predict_proba(x_test)[:, 1]))
    return auc, auc > 0.55


def rate_with_interval(count: int, trials: int) -> tuple[float, tuple[float, float]]:
    from scipy.stats import binomtest

    interval = binomtest(count, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return count / trials, (float(interval.low), float(interval.high))


def run(report: Report, args) -> None:
    from dgx_assets.production.drift import judge_embedding_drift

    rows = 2000 if args.quick else 10_000
    batches_same, batches_shifted = (50, 50) if args.quick else (400, 100)
    source = Source()
    shift = source.loadings[0]  # one standard deviation of the first factor
    reference = source.draw(rows, np.random.default_rng(1))
    same = source.draw(rows, np.random.default_rng(2))
    shifted = source.draw(rows, np.random.default_rng(3), shift)
    report.params.update(rows=rows, dims=DIMS, batch=BATCH, batches_same=batches_same, batches_shifted=batches_shifted)

    verdicts = {
        name: (judge_embedding_drift(reference, current), evidently_model_method(reference, current))
        for name, current in (("same", same), ("shifted", shifted))
    }
    for name, (project, (baseline_auc, baseline_drifted)) in verdicts.items():
        print(f"{name}: project {project.summary()}; baseline AUC {baseline_auc:.3f} drifted={baseline_drifted}")
        report.figure(f"{name}_project", project.to_dict())
        report.figure(f"{name}_baseline", {"roc_auc": round(baseline_auc, 4), "drifted": baseline_drifted})
        check(project.drifted == baseline_drifted == (name == "shifted"), f"{name}: project and baseline disagree on drift")

    timings = interleaved(
        {"project": lambda: judge_embedding_drift(reference, same), "baseline": lambda: evidently_model_method(reference, same)},
        args.repeats,
    )
    project, baseline = timings["project"], timings["baseline"]
    report.figure("project", project.to_dict())
    report.figure("baseline", baseline.to_dict())
    print(f"project {project.describe()}; baseline {baseline.describe()}")
    report.result(
        f"drift_check_{rows // 1000}k_seconds",
        project.median,
        "<=",
        5.0,
        f"{rows:,} x {rows:,} embeddings of {DIMS} dims",
        interval=(min(project.samples), max(project.samples)),
        rounds=len(project.samples),
    )
    report.ratio("drift_check_speed_ratio_vs_evidently_model", baseline, project, ">=", 1.0, "baseline time / project time")

    line_reference = reference[:2000]
    false_alarms = sum(
        judge_embedding_drift(line_reference, source.draw(BATCH, np.random.default_rng(1000 + i)), seed=i).drifted
        for i in range(batches_same)
    )
    detected = sum(
        judge_embedding_drift(line_reference, source.draw(BATCH, np.random.default_rng(5000 + i), shift), seed=i).drifted
        for i in range(batches_shifted)
    )
    for name, count, trials, op, goal in (
        ("drift_false_alarm_rate_60_images", false_alarms, batches_same, "<=", 0.02),
        ("drift_power_60_images_one_sd_shift", detected, batches_shifted, ">=", 0.9),
    ):
        rate, interval = rate_with_interval(count, trials)
        print(f"{name}: {count}/{trials}")
        report.figure(name, {"count": count, "trials": trials})
        report.result(name, rate, op, goal, f"{count} of {trials} batches, alpha 0.01", interval=interval, rounds=trials)


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__))
