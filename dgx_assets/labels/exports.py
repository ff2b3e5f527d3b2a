"""Reading labelling tools' exports into (image, label) records, every problem kept as one line.

Label Studio's JSON (tasks with their annotations), JSON_MIN (one flat object per task) and CSV name an image by
its `sha256` (preferred) or its `path`; CVAT's ImageNet export (a folder or a .zip, one folder per class) holds
the image files themselves, matched by the sha256 of their bytes. Nothing here reads a file an export names:
the importer matches each record against the lake's raw_images rows. A zip is read member by member within
bounds (count, total size, compression ratio), and one with absolute or `..` paths or links is refused.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

CHOICE = "choice"  # the <Choices name="..."> of Label Studio's image classification template
META_FIELDS = ("id", "image", "path", "sha256", "annotator", "annotation_id", "created_at", "updated_at", "lead_time")
MAX_MEMBERS = 100_000  # files in a CVAT export
MAX_TOTAL_BYTES = 8 * 1024**3  # uncompressed bytes of a CVAT export
MAX_RATIO = 100  # uncompressed / compressed size of one zip member: images hardly compress, bombs do
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Record:
    """One labelled image: by content hash, or by the path the lake's raw_images row has."""

    where: str  # `task 3`, `defective/a.png`: for the problem lines
    label: str
    sha256: str | None = None
    path: str | None = None


@dataclass
class Export:
    format: str
    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_export(source: Path, choice: str = CHOICE, limits: ZipLimits | None = None) -> Export:
    """The records of one export file or folder, its format told by the extension and the content."""
    if source.is_symlink():
        return Export("?", problems=[f"{source}: a symbolic link: give the export itself"])
    if source.is_dir():
        return _finish(read_cvat_folder(source))
    if not source.is_file():
        return Export("?", problems=[f"{source}: no such file or folder"])
    if source.suffix.lower() == ".zip" or zipfile.is_zipfile(source):
        return _finish(read_cvat_zip(source, limits or ZipLimits()))
    data = source.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return Export("?", problems=[f"{source}: not UTF-8 text, nor a zip"])
    if source.suffix.lower() == ".json" or (source.suffix.lower() != ".csv" and text.lstrip()[:1] in "[{"):
        return _finish(read_json(text, choice))
    return _finish(read_csv(text, choice))


def _finish(export: Export) -> Export:
    if not export.records and not export.problems:
        export.problems.append(f"the {export.format} export holds no labelled image")
    return export


# --- Label Studio ----------------------------------------------------------------------------------------


def read_json(text: str, choice: str = CHOICE) -> Export:
    """Label Studio's JSON (`data` + `annotations`) or JSON_MIN (flat), told apart by the first task."""
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as error:
        return Export("JSON", problems=[f"malformed JSON: {error}"])
    if isinstance(tasks, dict):
        tasks = [tasks]
    if not isinstance(tasks, list) or not all(isinstance(task, dict) for task in tasks):
        return Export("JSON", problems=["malformed export: JSON must be a list of task objects"])
    if tasks and ("annotations" in tasks[0] or "data" in tasks[0]):
        export = Export("Label Studio JSON")
        for number, task in enumerate(tasks, 1):
            _full_task(export, f"task {task.get('id', number)}", task)
        return export
    export = Export("Label Studio JSON_MIN")
    _flat_rows(export, tasks, choice)
    return export


def _full_task(export: Export, where: str, task: dict) -> None:
    data, annotations = task.get("data"), task.get("annotations", [])
    if not isinstance(data, dict) or not isinstance(annotations, list):
        export.problems.append(f"{where}: malformed task: `data` must be an object and `annotations` a list")
        return
    labels: set[str] = set()
    for annotation in annotations:
        if not isinstance(annotation, dict) or not isinstance(annotation.get("result", []), list):
            export.problems.append(f"{where}: malformed annotation: {str(annotation)[:80]}")
            return
        if annotation.get("was_cancelled"):  # skipped by its annotator: no label
            continue
        for result in annotation.get("result", []):
            if isinstance(result, dict) and result.get("type") == "choices":
                choices = (result.get("value") or {}).get("choices")
                labels.update(_choices(export, where, {"choices": choices}) or ())
    _add(export, where, labels, data)


def _flat_rows(export: Export, rows: list[dict], choice: str) -> None:
    if rows and not any(choice in row for row in rows):
        names = sorted({name for row in rows for name in row} - set(META_FIELDS))
        export.problems.append(
            f"no `{choice}` column (the <Choices name> of the labelling config); the columns besides the image's "
            f"are {', '.join(names) or 'none'}: name the right one with --choice"
        )
        return
    for number, row in enumerate(rows, 1):
        where = f"task {row.get('id') or number}"
        labels = _choices(export, where, row.get(choice))
        if labels is not None:
            _add(export, where, set(labels), row)


def _choices(export: Export, where: str, value) -> list[str] | None:
    """A choice as JSON_MIN and CSV write it: `"defective"`, or `{"choices": ["defective"]}` (also as a JSON string)."""
    if value in (None, ""):
        return []
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            export.problems.append(f"{where}: malformed choice {value[:80]!r}")
            return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and isinstance(value.get("choices"), list) and all(isinstance(c, str) for c in value["choices"]):
        if len(value["choices"]) > 1:
            export.problems.append(f"{where}: several choices {value['choices']} in one answer: one label per image")
            return None
        return value["choices"]
    export.problems.append(f"{where}: malformed choice {str(value)[:80]!r}")
    return None


def _add(export: Export, where: str, labels: set[str], data: dict) -> None:
    if not labels:  # unlabelled, or every annotation cancelled: nothing to import
        return
    if len(labels) > 1:
        export.problems.append(f"{where}: conflicting annotations of one image: {', '.join(sorted(labels))}")
        return
    sha256 = str(data.get("sha256") or "").strip().lower() or None
    path = str(data.get("path") or data.get("image") or "").strip() or None
    if sha256 is None and path is None:
        export.problems.append(f"{where}: names no image (no `sha256`, `path` or `image`)")
        return
    export.records.append(Record(where, labels.pop(), sha256, path))


def read_csv(text: str, choice: str = CHOICE) -> Export:
    export = Export("Label Studio CSV")
    try:
        rows = list(csv.DictReader(io.StringIO(text), strict=True))
    except csv.Error as error:
        return Export(export.format, problems=[f"malformed CSV: {error}"])
    columns = rows[0].keys() if rows else ()
    if rows and not ({"sha256", "path", "image"} & set(columns)):
        return Export(export.format, problems=["malformed CSV: no `sha256`, `path` or `image` column in the header"])
    if any(None in row or None in row.values() for row in rows):
        return Export(export.format, problems=["malformed CSV: a row's field count differs from the header's"])
    _flat_rows(export, rows, choice)
    return export


# --- CVAT ImageNet -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZipLimits:
    members: int = MAX_MEMBERS
    total_bytes: int = MAX_TOTAL_BYTES
    ratio: float = MAX_RATIO


def _cvat_record(export: Export, relative: str, sha256: str) -> None:
    parts = relative.split("/")
    if len(parts) == 1:  # CVAT's ImageNet export puts images without a label at its top
        return
    if len(parts) != 2:
        export.problems.append(f"{relative}: not <class>/<image file>: an ImageNet export has one folder per class")
        return
    export.records.append(Record(relative, parts[0], sha256=sha256))


def read_cvat_folder(root: Path) -> Export:
    export = Export("CVAT ImageNet folder")
    folders = [root]
    while folders:
        folder = folders.pop()
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                relative = Path(entry.path).relative_to(root).as_posix()
                if entry.name.startswith("."):
                    continue
                if entry.is_symlink():
                    export.problems.append(f"{relative}: a symbolic link: links are not followed")
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    _cvat_record(export, relative, _hash_file(Path(entry.path)))
                else:
                    export.problems.append(f"{relative}: a special file: never opened")
    return export


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_cvat_zip(source: Path, limits: ZipLimits) -> Export:
    export = Export("CVAT ImageNet zip")
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as error:
        return Export(export.format, problems=[f"{source.name}: not a readable zip: {error}"])
    with archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        export.problems += _unsafe_members(members, limits)
        if export.problems:
            return export
        for info in members:
            if PurePosixPath(info.filename).name.startswith(".") or info.filename.startswith("__MACOSX/"):
                continue
            try:
                sha256 = _hash_member(archive, info)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as error:
                export.problems.append(f"{info.filename}: cannot be read from the zip: {error}")
                continue
            _cvat_record(export, info.filename, sha256)
    return export


def _unsafe_members(members: list[zipfile.ZipInfo], limits: ZipLimits) -> list[str]:
    """Problems that refuse the whole zip before any member is decompressed."""
    if len(members) > limits.members:
        return [f"the zip holds {len(members)} files, over the limit of {limits.members}"]
    problems = []
    total = sum(info.file_size for info in members)
    if total > limits.total_bytes:
        problems.append(f"the zip would unpack to {total} bytes, over the limit of {limits.total_bytes} (a zip bomb?)")
    for info in members:
        name = info.filename
        if name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":") or ".." in name.split("/"):
            problems.append(f"{name}: an absolute or `..` path in the zip")
        elif stat.S_ISLNK(info.external_attr >> 16):
            problems.append(f"{name}: a symbolic link in the zip: links are not followed")
        elif info.file_size > limits.ratio * max(info.compress_size, 1):
            problems.append(
                f"{name}: compressed {info.compress_size} bytes unpack to {info.file_size}, over a ratio of "
                f"{limits.ratio:g} (a zip bomb?)"
            )
    return problems


def _hash_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """The member's sha256, read in chunks and never past its declared size (a header may lie)."""
    digest, read = hashlib.sha256(), 0
    with archive.open(info) as member:
        while chunk := member.read(CHUNK):
            read += len(chunk)
            if read > info.file_size:
                raise ValueError(f"unpacks past its declared {info.file_size} bytes")
            digest.update(chunk)
    return digest.hexdigest()
