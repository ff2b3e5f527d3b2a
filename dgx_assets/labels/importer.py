"""Labels matched to the lake's images, written as a new landing batch in one rename.

Each record names an image by sha256 or by the path its raw_images row has; the bytes come from that row's
`content` (one snapshot of the table), never from a path the export supplies. The batch is written under a
hidden sibling (`.<batch>.staging-*`, which the landing sensor skips) and renamed into place in one step, so
the sensor sees all of it or nothing. Any problem refuses the whole import before anything is written.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import posixpath
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from dgx_assets.labels.exports import Record
from dgx_assets.lake.files import filesystem_for, normalize_uri

if TYPE_CHECKING:
    from dgx_assets.lake.store import Lake
    from dgx_assets.lake.tables import TableSnapshot

TABLE = "raw_images"
INDEX_COLUMNS = ["path", "label", "sha256", "format", "status"]
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")  # a batch or label folder the landing zone accepts
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "BMP": "bmp", "TIFF": "tif"}


class ImportRefused(Exception):
    """The import wrote nothing; `problems` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LakeImage:
    path: str  # as raw_images holds it
    sha256: str
    label: str | None
    format: str | None
    status: str | None


@dataclass
class LakeIndex:
    """What one snapshot of raw_images holds, content aside."""

    snapshot: TableSnapshot
    by_sha: dict[str, LakeImage] = field(default_factory=dict)
    by_path: dict[str, LakeImage] = field(default_factory=dict)
    labels: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Planned:
    image: LakeImage
    label: str
    name: str  # the file's name in its label folder


@dataclass(frozen=True)
class Imported:
    batch: str
    uri: str
    counts: dict[str, int]


def path_key(path: str) -> str:
    """A path as compared: `file:/a`, `file:///a` and `/a` alike; hdfs://nn:8020/a keeps its authority."""
    if path.startswith("file:"):
        return "/" + path.removeprefix("file:").lstrip("/")
    return path.rstrip("/")


def index_lake(lake: Lake) -> LakeIndex:
    snapshot = lake.tables.snapshot(TABLE)
    if not snapshot.uris:
        raise ImportRefused([f"the lake {lake.root} holds no {TABLE} rows: ingest a batch first"])
    index = LakeIndex(snapshot)
    for batch in snapshot.dataset().to_batches(columns=INDEX_COLUMNS):
        for row in batch.to_pylist():
            if row["label"]:
                index.labels.add(row["label"])
            if not row["sha256"]:
                continue
            image = LakeImage(row["path"], row["sha256"], row["label"], row["format"], row["status"])
            if image.status == "valid" or image.sha256 not in index.by_sha:
                index.by_sha[image.sha256] = image
            index.by_path[path_key(image.path)] = image
    return index


def plan(records: list[Record], index: LakeIndex, allow_new_labels: bool = False) -> tuple[list[Planned], list[str]]:
    """Each record matched to one lake image, with its file name in the new batch; the problems found."""
    problems: list[str] = []
    matched: dict[str, tuple[Record, LakeImage]] = {}
    for record in records:
        image = _match(record, index, problems)
        if image is None:
            continue
        if not SAFE_NAME.fullmatch(record.label):
            problems.append(f"{record.where}: label {record.label!r} cannot name a folder (letters, digits, `_.+-`)")
            continue
        if record.label not in index.labels and not allow_new_labels:
            known = ", ".join(sorted(index.labels)) or "none"
            problems.append(
                f"{record.where}: label {record.label!r} is not one the model knows ({known}); "
                "--allow-new-labels imports it anyway"
            )
            continue
        if image.sha256 in matched:
            first = matched[image.sha256][0]
            kind = "conflicting labels" if first.label != record.label else "a duplicate task"
            problems.append(
                f"{record.where}: {kind} for the image {image.sha256[:12]} ({record.label!r}; "
                f"{first.where} has {first.label!r}): one task per image"
            )
            continue
        matched[image.sha256] = (record, image)
    planned, taken = [], set()
    for record, image in matched.values():
        base = posixpath.basename(path_key(image.path))
        name = base if SAFE_NAME.fullmatch(base) and (record.label, base) not in taken else _sha_name(image)
        taken.add((record.label, name))
        planned.append(Planned(image, record.label, name))
    return planned, problems


def _match(record: Record, index: LakeIndex, problems: list[str]) -> LakeImage | None:
    if record.sha256 is not None:
        image = index.by_sha.get(record.sha256)
        what = f"the image with sha256 {record.sha256}"
    else:
        image = index.by_path.get(path_key(record.path or ""))
        what = f"the image {record.path}"
    if image is None:
        problems.append(f"{record.where}: {what} is not in the lake's {TABLE} table (only images the lake holds are imported)")
    elif image.status != "valid":
        problems.append(f"{record.where}: {what} is in {TABLE} as {image.status!r}, with no content to import")
        return None
    return image


def _sha_name(image: LakeImage) -> str:
    extension = posixpath.splitext(image.path)[1].lstrip(".").lower() or EXTENSIONS.get(image.format or "", "img")
    return f"{image.sha256}.{extension}"


LABEL_BATCH = re.compile(r".+-labels-\d{8}T\d{6}Z")  # what batch_name makes


def is_label_batch(batch: str) -> bool:
    """Whether a landing batch is one import-labels wrote (inspectors' labels)."""
    return LABEL_BATCH.fullmatch(batch) is not None


def batch_name(name: str, now: dt.datetime | None = None) -> str:
    if not SAFE_NAME.fullmatch(name):
        raise ImportRefused([f"--batch {name!r}: use letters, digits and `_.+-`, starting with a letter or digit"])
    return f"{name}-labels-{(now or dt.datetime.now(dt.UTC)):%Y%m%dT%H%M%SZ}"


def contents(snapshot: TableSnapshot, wanted: set[str]) -> dict[str, bytes]:
    """The `content` of the wanted images, read batch by batch from the snapshot's files."""
    import pyarrow.compute as pc

    found: dict[str, bytes] = {}
    condition = pc.field("sha256").isin(sorted(wanted)) & (pc.field("status") == "valid")
    for batch in snapshot.dataset().to_batches(columns=["sha256", "content"], filter=condition):
        for sha256, content in zip(batch.column("sha256").to_pylist(), batch.column("content").to_pylist(), strict=True):
            if content is not None and hashlib.sha256(content).hexdigest() == sha256:
                found.setdefault(sha256, content)
    return found


def write_batch(landing_uri: str, batch: str, planned: list[Planned], data: dict[str, bytes]) -> str:
    """Every file under a hidden sibling, then one rename; returns the batch's URI. A failure deletes the sibling."""
    landing_uri = normalize_uri(landing_uri)
    fs, root = filesystem_for(landing_uri)
    final = posixpath.join(root, batch)
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        raise ImportRefused([f"{landing_uri}/{batch} exists already: run again in a second"])
    staging = posixpath.join(root, f".{batch}.staging-{uuid.uuid4().hex[:12]}")
    fs.create_dir(staging, recursive=True)
    try:
        for item in planned:
            fs.create_dir(posixpath.join(staging, item.label), recursive=True)
            with fs.open_output_stream(posixpath.join(staging, item.label, item.name)) as out:
                out.write(data[item.image.sha256])
        fs.move(staging, final)
    except BaseException:
        if fs.get_file_info(staging).type == pafs.FileType.Directory:
            fs.delete_dir(staging)
        raise
    return f"{landing_uri}/{batch}"


def import_labels(records: list[Record], lake: Lake, landing_uri: str, batch: str, allow_new_labels: bool = False) -> Imported:
    """Match, read, write: all of it, or nothing and ImportRefused with every problem."""
    name = batch_name(batch)
    index = index_lake(lake)
    planned, problems = plan(records, index, allow_new_labels)
    if problems:
        raise ImportRefused(problems)
    data = contents(index.snapshot, {item.image.sha256 for item in planned})
    missing = [item for item in planned if item.image.sha256 not in data]
    if missing:
        raise ImportRefused(
            [f"{item.image.path}: its content in {TABLE} is missing or does not match its sha256" for item in missing]
        )
    uri = write_batch(landing_uri, name, planned, data)
    return Imported(name, uri, dict(Counter(item.label for item in planned)))
