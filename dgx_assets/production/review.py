"""The review queue: the images of a batch the champion is least sure of, as files for a Label Studio project.

`<lake>/review_queue/batch=<batch escaped>/` (the lake's partition folder, so any batch name is one plain name):

    tasks.json            Label Studio tasks (its JSON import format), least sure first
    labeling_config.xml   the project's labelling config: the image, the saliency picture, one choice of class
    images/<sha256>.<ext> the image's bytes, copied from the lake's raw_images table
    saliency/<sha256>.png where the model looked (made elsewhere)

The tasks link to the images through the read-only docs server (`/review_queue/...`), and carry the image's
`sha256` and raw_images `path`, so that Label Studio's exports of them (JSON, JSON_MIN, CSV) come back through
`dgx-assets import-labels` (labels/exports.py) as records of the right images.

A prediction's `score` is the model's margin, |P(defective) - threshold|: 0 on the threshold, larger the surer
it is. Label Studio's "by prediction score" order (ascending) then puts the least sure first, the order
`least_certain` picks them in.
"""

from __future__ import annotations

import io
import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dgx_assets import links
from dgx_assets.labels.exports import CHOICE
from dgx_assets.labels.importer import EXTENSIONS, TABLE, contents
from dgx_assets.lake.files import partition_folder
from dgx_assets.training.decision import positive_index

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake

QUEUE_ASSET = links.REVIEW_QUEUE_ROUTE  # the lake folder is the docs server's route
DEFAULT_SIZE = 20
TASKS_FILE, CONFIG_FILE = "tasks.json", "labeling_config.xml"
IMAGES, SALIENCY = "images", "saliency"
IMAGE, SALIENCY_IMAGE = "image", "saliency"  # the <Image name>s, and the task data keys their `$value`s read
SHA256 = re.compile(r"[0-9a-f]{64}")  # becomes a file name: nothing else may
XML_ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # characters XML 1.0 cannot carry at all


@dataclass(frozen=True)
class RawImage:
    content: bytes
    extension: str  # of images/<sha256>.<ext>: the format its bytes are in


# --- choosing -------------------------------------------------------------------------------------------


def margin(probability: float, threshold: float) -> float:
    """How far the model is from changing its mind: the queue's order and the tasks' `score`."""
    return abs(probability - threshold)


def least_certain(rows: Iterable[Mapping[str, Any]], threshold: float, size: int = DEFAULT_SIZE) -> list[Mapping[str, Any]]:
    """The `size` rows (mappings with `sha256` and `defect_probability`) nearest the threshold, nearest first;
    ties by sha256, so a re-run picks the same images. Unscored rows (None, NaN) are left out, and an image
    scored twice (landed twice) is queued once."""
    scored = [row for row in rows if row.get("defect_probability") is not None and not math.isnan(row["defect_probability"])]
    scored.sort(key=lambda row: (margin(row["defect_probability"], threshold), row["sha256"]))
    queued: dict[str, Mapping[str, Any]] = {}
    for row in scored:
        if len(queued) == size:
            break
        queued.setdefault(row["sha256"], row)
    return list(queued.values())


def import_command(batch: str) -> str:
    """What an inspector runs with the queue's Label Studio export: the new batch named after this one, in the
    characters `--batch` accepts (a batch name may hold `#`, spaces, any letter)."""
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", batch).lstrip("_.+-")[:80] or "review"
    return f"dgx-assets import-labels EXPORT.json --batch {name}"


# --- addresses --------------------------------------------------------------------------------------------


def queue_url(docs_url: str, batch: str, *names: str) -> str:
    """A file of the batch's queue on the docs server: the batch is escaped into its folder's name, which the URL
    escapes again, so `#`, `%`, `?`, spaces and non-ASCII letters stay data (`lot#1` -> `batch%3Dlot%25231`)."""
    return links.docs_page(docs_url, QUEUE_ASSET, partition_folder(batch), *names)


def image_file(sha256: str, extension: str) -> tuple[str, str]:
    return IMAGES, f"{_checked_sha(sha256)}.{extension}"


def saliency_file(sha256: str) -> tuple[str, str]:
    return SALIENCY, f"{_checked_sha(sha256)}.png"


def _checked_sha(sha256: str) -> str:
    if not SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256[:80]!r} is not a sha256 (64 lower-case hex digits)")
    return sha256


# --- Label Studio -----------------------------------------------------------------------------------------


def labeling_config(class_names: Sequence[str]) -> str:
    """Label Studio's config: the image, one required choice among the classes (<Choices name> as exports.py
    reads it), and the saliency picture beside it. ElementTree escapes the names (`<`, `&`, quotes)."""
    if not class_names or len(set(class_names)) != len(class_names):
        raise ValueError(f"the classes must be distinct and at least one: {list(class_names)}")
    if bad := [name for name in class_names if not name.strip() or XML_ILLEGAL.search(name)]:
        raise ValueError(f"class names XML cannot carry, or blank: {bad}")
    view = ET.Element("View")
    ET.SubElement(view, "Image", name=IMAGE, value=f"${IMAGE}", zoom="true")
    choices = ET.SubElement(view, "Choices", name=CHOICE, toName=IMAGE, choice="single", required="true", showInLine="true")
    for name in class_names:
        ET.SubElement(choices, "Choice", value=name)
    ET.SubElement(view, "Header", value="Where the model looked")
    ET.SubElement(view, "Image", name=SALIENCY_IMAGE, value=f"${SALIENCY_IMAGE}")
    ET.indent(view)
    return ET.tostring(view, encoding="unicode") + "\n"


def label_studio_tasks(
    queued: Sequence[Mapping[str, Any]],
    class_names: Sequence[str],
    docs_url: str,
    batch: str,
    model_version: str,
    threshold: float,
    extensions: Mapping[str, str],
) -> list[dict]:
    """One task per queued row (`sha256`, `path`, `defect_probability`), its image `images/<sha256>.<ext>` with
    the extension `extensions` gives, and the model's class as a prediction scored by its margin."""
    positive = positive_index(class_names)
    if positive is None:
        raise ValueError(f"a review queue is for a two-class model: P(defective) and a threshold; got {list(class_names)}")
    tasks = []
    for row in queued:
        sha256, probability = row["sha256"], row["defect_probability"]
        predicted = class_names[positive] if probability >= threshold else class_names[1 - positive]
        result = {"from_name": CHOICE, "to_name": IMAGE, "type": "choices", "value": {"choices": [predicted]}}
        data = {
            IMAGE: queue_url(docs_url, batch, *image_file(sha256, extensions[sha256])),
            "path": str(row["path"]),
            "sha256": sha256,
            SALIENCY_IMAGE: queue_url(docs_url, batch, *saliency_file(sha256)),
        }
        prediction = {
            "model_version": model_version,
            "score": round(float(margin(probability, threshold)), 6),
            "result": [result],
        }
        tasks.append({"data": data, "predictions": [prediction]})
    return tasks


# --- the lake ----------------------------------------------------------------------------------------------


def queue_uri(lake: Lake, batch: str) -> str:
    """<lake>/review_queue/batch=<escaped>: named as the tables name their partition folders. (`Lake.uri` takes
    names as they are; `asset_uri(asset, batch)` would escape the escaped name once more.)"""
    return lake.uri(QUEUE_ASSET, partition_folder(batch))


def raw_images(lake: Lake, sha256s: Iterable[str]) -> dict[str, RawImage]:
    """The bytes of these images from one snapshot of raw_images (valid rows, their hash checked, as
    import-labels reads them), each with the extension of the format its bytes are in."""
    from PIL import Image

    snapshot = lake.tables.snapshot(TABLE)
    wanted = set(sha256s)
    found = contents(snapshot, wanted) if wanted and snapshot.uris else {}
    images = {}
    for sha256, content in found.items():
        with Image.open(io.BytesIO(content)) as image:  # reads the header only
            images[sha256] = RawImage(content, EXTENSIONS[image.format or ""])
    return images


def write_queue(
    lake: Lake,
    batch: str,
    queued: Sequence[Mapping[str, Any]],
    class_names: Sequence[str],
    *,
    docs_url: str,
    model_version: str,
    threshold: float,
    saliency: Mapping[str, bytes],
    images: Mapping[str, RawImage] | None = None,
) -> str:
    """Write the batch's queue (images from raw_images unless given) under a staging name, then swap it in: a
    reader (the docs server, Label Studio's browser) sees the previous queue or this one, never half of it.
    Returns the folder's URI. Every queued image needs its bytes and its saliency picture."""
    shas = [row["sha256"] for row in queued]
    images = raw_images(lake, shas) if images is None else images
    missing = [sha for sha in shas if sha not in images] + [f"{sha} (saliency)" for sha in shas if sha not in saliency]
    if missing:
        raise ValueError(f"the review queue of {batch!r} lacks: {', '.join(missing)}")
    extensions = {sha: images[sha].extension for sha in shas}
    tasks = label_studio_tasks(queued, class_names, docs_url, batch, model_version, threshold, extensions)
    staging = lake.staging_uri(QUEUE_ASSET)
    files: dict[tuple[str, ...], bytes] = {
        (TASKS_FILE,): (json.dumps(tasks, indent=2, ensure_ascii=False) + "\n").encode(),
        (CONFIG_FILE,): labeling_config(class_names).encode(),
    }
    for sha in shas:
        files[image_file(sha, extensions[sha])] = images[sha].content
        files[saliency_file(sha)] = saliency[sha]
    for names, data in files.items():
        lake.write_bytes("/".join([staging, *names]), data)
    final = queue_uri(lake, batch)
    lake.fs.create_dir(lake.fs_path(lake.uri(QUEUE_ASSET)), recursive=True)  # the first queue's parent
    lake.swap_in(staging, final)
    return final
