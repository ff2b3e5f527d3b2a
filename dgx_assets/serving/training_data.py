"""Training images and captions for the small generator (numpy + Pillow, no paddle).

Images come from the ELPV package (solar-cell electroluminescence, defect probability and mono/poly type)
or from a folder laid out `<folder>/<label>/<image>` (the landing layout's batch folder also works: every
image below it is used, its parent folder names become caption words). Captions are written from the
labels in English and Chinese with random wording, so the model learns both languages and the words that
matter ("defective" / "functional", "mono" / "poly") rather than one fixed sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"}

# Words per condition, English and Chinese; the generator learns them all as synonyms.
CONDITION_WORDS = {
    "functional": ["functional", "defect-free", "intact", "healthy", "good", "正常", "完好", "无缺陷", "合格"],
    "slightly_defective": ["slightly defective", "minor defect", "possibly defective", "轻微缺陷", "可能有缺陷"],
    "defective": ["defective", "cracked", "broken", "damaged", "faulty", "有缺陷", "裂纹", "破损", "缺陷"],
    "mono": ["mono", "monocrystalline", "mono-crystalline", "单晶", "单晶硅"],
    "poly": ["poly", "polycrystalline", "multicrystalline", "多晶", "多晶硅"],
}
SUBJECT_WORDS = [
    "electroluminescence image of a solar cell",
    "EL image of a photovoltaic cell",
    "solar cell",
    "cell",
    "太阳能电池片的电致发光图像",
    "光伏电池片",
    "电池片",
]


@dataclass
class TrainingSet:
    images: np.ndarray  # float32 [N, 1, S, S] in [0, 1]
    conditions: list[list[str]]  # condition keys per image, e.g. ["defective", "mono"]
    source: str


def elpv_available() -> bool:
    try:
        import elpv_dataset  # noqa: F401
    except ImportError:
        return False
    return True


def load_elpv(size: int, limit: int | None = None, seed: int = 0) -> TrainingSet:
    from elpv_dataset.utils import load_dataset

    images, probabilities, types = load_dataset()
    order = np.random.default_rng(seed).permutation(len(images))
    if limit:
        order = order[:limit]
    conditions = []
    for index in order:
        probability = float(probabilities[index])
        state = "functional" if probability < 0.2 else "defective" if probability > 0.8 else "slightly_defective"
        conditions.append([state, str(types[index]).strip().lower()])
    return TrainingSet(_resize_all([images[i] for i in order], size), conditions, "elpv")


def load_folder(folder: str | Path, size: int, limit: int | None = None, seed: int = 0) -> TrainingSet:
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    if not files:
        raise ValueError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root}")
    random.Random(seed).shuffle(files)
    files = files[:limit] if limit else files
    arrays, conditions = [], []
    for path in files:
        try:
            with Image.open(path) as image:
                arrays.append(np.asarray(image.convert("L")))
        except OSError:
            continue  # an unreadable file is skipped; the rest still trains
        # Folder names between the root and the file become the caption's condition words.
        conditions.append([part.lower() for part in path.relative_to(root).parts[:-1]])
    if not arrays:
        raise ValueError(f"none of the {len(files)} image files under {root} could be decoded")
    return TrainingSet(_resize_all(arrays, size), conditions, str(root))


def _resize_all(arrays, size: int) -> np.ndarray:
    out = np.empty((len(arrays), 1, size, size), dtype=np.float32)
    for index, array in enumerate(arrays):
        image = Image.fromarray(np.asarray(array)).convert("L").resize((size, size), Image.Resampling.BILINEAR)
        out[index, 0] = np.asarray(image, dtype=np.float32) / 255.0
    return out


def caption(conditions: list[str], rng: random.Random) -> str:
    """A random bilingual caption naming the given conditions (unknown keys are used as words)."""
    parts = [rng.choice(CONDITION_WORDS.get(key, [key.replace("_", " ")])) for key in conditions]
    rng.shuffle(parts)
    if rng.random() < 0.8:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(SUBJECT_WORDS))
    joiner = "" if all(_is_cjk(p) for p in parts) else " "
    return joiner.join(parts)


def all_caption_words(conditions: list[list[str]]) -> list[str]:
    """Every phrase a caption can contain, so the tokenizer's vocabulary covers them all."""
    keys = {key for keys in conditions for key in keys}
    phrases = list(SUBJECT_WORDS)
    for key in keys:
        phrases += CONDITION_WORDS.get(key, [key.replace("_", " ")])
    for words in CONDITION_WORDS.values():
        phrases += words
    return phrases


def _is_cjk(text: str) -> bool:
    return all("\u3400" <= ch <= "\u9fff" for ch in text if not ch.isspace())
