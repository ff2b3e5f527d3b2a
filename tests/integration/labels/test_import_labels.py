"""`dgx-assets import-labels` end to end on a real lake: an Iceberg raw_images table of real PNGs, exports in each
format referencing them, and the new landing batch the landing sensor's listing sees as complete."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile

import pyarrow as pa
from imagefactory import encode, gradient
from PIL import Image
from support.lake_tables import commit_rows

from dgx_assets import cli
from dgx_assets.ingest.landing import scan_landing

LABELS = {"a.png": "defective", "b.png": "functional", "c.png": "functional"}


def make_lake(tmp_path):
    root, landing = tmp_path / "lake", tmp_path / "landing"
    (landing / "b1").mkdir(parents=True)  # an ingested batch still landed: the new one goes beside it
    images = {name: encode(Image.fromarray(gradient(seed=seed), "L"), "PNG") for seed, name in enumerate(LABELS)}
    paths = {name: f"file:{landing}/b1/{label}/{name}" for name, label in LABELS.items()}
    for name, label in LABELS.items():  # the landed files differ from the table's bytes: the table's are read
        (landing / "b1" / label).mkdir(exist_ok=True)
        (landing / "b1" / label / name).write_bytes(b"changed since ingest")
    names = list(LABELS)
    rows = pa.table(
        {
            "path": [paths[n] for n in names],
            "batch": ["b1"] * 3,
            "label": [LABELS[n] for n in names],
            "size_bytes": [len(images[n]) for n in names],
            "sha256": [hashlib.sha256(images[n]).hexdigest() for n in names],
            "format": ["PNG"] * 3,
            "width": pa.array([64] * 3, pa.int32()),
            "height": pa.array([48] * 3, pa.int32()),
            "status": ["valid"] * 3,
            "reason": pa.array([None] * 3, pa.string()),
            "content": pa.array([images[n] for n in names], pa.binary()),
        }
    )
    commit_rows(root, "raw_images", rows, "b1")
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in images.items()}
    return root, landing, images, sha, paths


def run_import(root, landing, source, capsys) -> str:
    before = set(os.listdir(landing))
    assert cli.main(["import-labels", str(source), "--batch", "line4", "--lake", str(root), "--landing", str(landing)]) == 0
    assert "3 images into" in capsys.readouterr().out
    (new,) = set(os.listdir(landing)) - before  # nothing hidden left beside it
    assert re.fullmatch(r"line4-labels-\d{8}T\d{6}Z", new)
    return new


def test_each_format_lands_a_complete_batch_of_the_tables_bytes(tmp_path, capsys):
    root, landing, images, sha, paths = make_lake(tmp_path)
    # The inspectors relabel b.png defective; the others keep their labels.
    relabelled = LABELS | {"b.png": "defective"}
    full = [
        {
            "id": n,
            "data": {"image": f"/data/upload/{name}", "sha256": sha[name]},
            "annotations": [
                {"result": [{"type": "choices", "value": {"choices": ["functional"]}}], "was_cancelled": True},
                {"result": [{"type": "choices", "value": {"choices": [label]}, "from_name": "choice", "to_name": "image"}]},
            ],
        }
        for n, (name, label) in enumerate(relabelled.items(), 1)
    ]
    (tmp_path / "tasks.json").write_text(json.dumps(full))
    (tmp_path / "min.json").write_text(
        json.dumps([{"image": f"/data/{name}", "path": paths[name], "choice": label} for name, label in relabelled.items()])
    )
    (tmp_path / "tasks.csv").write_text(
        "image,path,sha256,choice\n" + "".join(f"/data/{n},,{sha[n]},{label}\n" for n, label in relabelled.items())
    )
    with zipfile.ZipFile(tmp_path / "cvat.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name, label in relabelled.items():
            archive.writestr(f"{label}/frame_{name}", images[name])  # CVAT's own file names: matched by content
    for source in ("tasks.json", "min.json", "tasks.csv", "cvat.zip"):
        batch = run_import(root, landing, tmp_path / source, capsys)
        landed = {
            str(path.relative_to(landing / batch)): path.read_bytes() for path in (landing / batch).rglob("*") if path.is_file()
        }
        assert landed == {f"{label}/{name}": images[name] for name, label in relabelled.items()}, source
        state = scan_landing(str(landing))[batch]
        assert state.complete and state.files == 3 and not state.refused
        os.rename(landing / batch, tmp_path / f"done-{source}")  # the next format's batch may take the same second
