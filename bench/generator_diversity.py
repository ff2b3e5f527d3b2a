"""Stand-in generator diversity: the demo's 12 prompts through the generator `make demo` builds, embedded and compared.

Each round builds the local ERNIE-Image stand-in (`dgx-assets build-generator`, the demo's settings, a training
seed of its own) in its own process, generates the bilingual demo prompts at 512x512 with their seeds and measures
what the `generated_images_diverse` check measures: the mean pairwise cosine distance of the images'
EfficientNet-Lite0 embeddings. The goal is the check's floor (0.1), the line between the stand-in's near-duplicates
and the most uniform real cells (0.21). Quick: the `--quick` generator, one round.
"""

from __future__ import annotations

import json
import statistics

from bench.common import Report, main, work_dir

NAME = "generator_diversity"


def run(report: Report, args) -> None:
    from dgx_assets.generation import launcher
    from dgx_assets.generation.diversity import MIN_MEAN_DISTANCE, embed, pairwise_diversity
    from dgx_assets.generation.prompts import demo_rows
    from dgx_assets.serving.engine import GeneratorEngine  # paddle before embed's TensorFlow: the other order crashes

    rows, means, closest = demo_rows(), [], []
    for seed in range(args.repeats):
        out = launcher.build_generator(work_dir(NAME) / f"generator-{seed}", quick=args.quick, extra_args=["--seed", str(seed)])
        engine = GeneratorEngine(out, device="cpu")
        images = [engine.generate(engine.tokenize(row["prompt"]), row["seed"], 512, 512)[0] for row in rows]
        diversity = pairwise_diversity([row["id"] for row in rows], embed(images))
        meta = json.loads((out / "generator_meta.json").read_text())
        print(f"   seed {seed}: mean pairwise distance {diversity.mean_distance:.4f} after {meta['steps']} steps")
        means.append(diversity.mean_distance)
        closest.append(diversity.closest)
    report.params["quick"] = args.quick
    report.figure("mean_pairwise_distance_by_seed", [round(m, 4) for m in means])
    report.figure("closest_pairs_by_seed", closest)
    report.result(
        "generated_mean_pairwise_distance",
        statistics.median(means),
        ">=",
        MIN_MEAN_DISTANCE,
        "median over training seeds",
        interval=(min(means), max(means)),
        rounds=len(means),
    )


if __name__ == "__main__":
    raise SystemExit(main(NAME, run, __doc__))
