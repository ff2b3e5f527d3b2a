"""Benchmark inputs, generated on this machine (never committed): synthetic landing batches and ELPV.

A landing batch is `<landing>/<batch>/<label>/<file>`, as docs/architecture.md lays it out. Synthetic images look
like electroluminescence shots of solar cells (a bright cell, dark busbars, grain noise, the odd crack),
so they compress about as well as the real ELPV PNGs (tens of KB at 300x300), half grey PNG and half
RGB JPEG. Each set is written once, under `.dgx/bench/data/`, and reused while its marker file exists.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.common import work_dir

LABELS = ("defective", "functional")


def synthetic_pixels(seed: int, size: int = 300) -> tuple[np.ndarray, str]:
    """A cell-like grey image and its label (defective ones carry a dark crack)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = 150 + 50 * np.sin(np.pi * x) * np.sin(np.pi * y) + rng.normal(0, 4, (size, size))
    for bar in (0.25, 0.5, 0.75):  # busbars
        base[:, int(bar * size) - 2 : int(bar * size) + 2] -= 60
    label = LABELS[seed % 2]
    if label == "defective":
        start, slope = rng.uniform(0, size), rng.uniform(-1, 1)
        rows = np.arange(size)
        cols = np.clip((start + slope * rows).astype(int), 0, size - 1)
        for width in range(-1, 2):
            base[rows, np.clip(cols + width, 0, size - 1)] -= 80
    return np.clip(base, 0, 255).astype(np.uint8), label


def _write_one(job: tuple[int, str, int]) -> None:
    from PIL import Image

    seed, root, size = job
    pixels, label = synthetic_pixels(seed, size)
    buffer = io.BytesIO()
    if seed % 4 < 2:
        Image.fromarray(pixels, "L").save(buffer, format="PNG")
        name = f"cell-{seed:06d}.png"
    else:
        rgb = np.stack([pixels, pixels, np.clip(pixels.astype(int) + 8, 0, 255).astype(np.uint8)], axis=-1)
        Image.fromarray(rgb, "RGB").save(buffer, format="JPEG", quality=90)
        name = f"cell-{seed:06d}.jpg"
    folder = Path(root) / label
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(buffer.getvalue())


def synthetic_landing(count: int, size: int = 300) -> tuple[Path, str]:
    """(landing root, batch name) holding `count` synthetic images of `size`x`size`."""
    landing = work_dir("data") / f"landing-synthetic-{count}-{size}"
    batch = "synthetic"
    done = landing.with_name(landing.name + ".done")
    if not done.exists():
        print(f"writing {count:,} synthetic {size}x{size} images under {landing} (once)", flush=True)
        jobs = [(seed, str(landing / batch), size) for seed in range(count)]
        with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
            list(pool.map(_write_one, jobs, chunksize=64))
        done.write_text(str(count))
    return landing, batch


def elpv_available() -> bool:
    try:
        import elpv_dataset  # noqa: F401
    except ImportError:
        return False
    return True


def elpv_landing(limit: int | None = None) -> tuple[Path, str] | None:
    """(landing root, batch name) holding the ELPV images (all of them unless `limit`), or None if absent."""
    if not elpv_available():
        return None
    from dgx_assets.demo_seed import seed_landing

    landing = work_dir("data") / f"landing-elpv-{limit or 'all'}"
    done = landing.with_name(landing.name + ".done")
    if not done.exists():
        print(f"copying the ELPV images into {landing} (once)", flush=True)
        seed_landing(str(landing), batches=1, limit=limit)
        done.write_text("ok")
    return landing, "elpv-01"


def image_files(batch_dir: Path) -> list[Path]:
    return sorted(p for p in batch_dir.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
