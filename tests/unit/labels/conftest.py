"""A lake whose raw_images table holds a few real PNGs (committed as ingest commits, without Spark)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from imagefactory import encode, gradient
from PIL import Image
from support.lake_tables import commit_rows


@dataclass
class LabelLake:
    root: Path
    landing: Path
    images: dict[str, bytes]  # file name -> bytes
    sha: dict[str, str]  # file name -> sha256
    paths: dict[str, str]  # file name -> raw_images' path

    def cli(self, *args: str) -> list[str]:
        return ["import-labels", *args, "--lake", str(self.root), "--landing", str(self.landing)]

    def landing_files(self) -> list[str]:
        return sorted(str(p.relative_to(self.landing)) for p in self.landing.rglob("*"))


def build_lake(tmp_path: Path) -> LabelLake:
    root, landing = tmp_path / "lake", tmp_path / "landing"
    landing.mkdir(parents=True)
    labels = {"a.png": "defective", "b.png": "functional", "c.png": "functional", "d.png": "defective"}
    images = {name: encode(Image.fromarray(gradient(seed=seed), "L"), "PNG") for seed, name in enumerate(labels)}
    paths = {name: f"file:{landing}/b1/{label}/{name}" for name, label in labels.items()}
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in images.items()}
    names = list(labels)
    rows = pa.table(
        {
            "path": [paths[n] for n in names] + [f"file:{landing}/b1/defective/broken.png"],
            "batch": ["b1"] * 5,
            "label": [labels[n] for n in names] + ["defective"],
            "size_bytes": [len(images[n]) for n in names] + [10],
            "sha256": [sha[n] for n in names] + ["0" * 64],
            "format": ["PNG"] * 4 + [None],
            "width": pa.array([64] * 4 + [None], pa.int32()),
            "height": pa.array([48] * 4 + [None], pa.int32()),
            "status": ["valid"] * 4 + ["corrupted"],
            "reason": [None] * 4 + ["truncated"],
            "content": pa.array([images[n] for n in names] + [None], pa.binary()),
        }
    )
    commit_rows(root, "raw_images", rows, "b1")
    return LabelLake(root, landing, images, sha, paths)


@pytest.fixture
def label_lake(tmp_path) -> LabelLake:
    return build_lake(tmp_path)
