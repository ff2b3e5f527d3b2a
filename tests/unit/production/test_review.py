"""The review queue: which images it takes, the Label Studio files it writes, the addresses it gives them, and
Label Studio's exports of its tasks read back by import-labels' reader."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from support.review_queue import CLASSES, build_queue_lake, png

from dgx_assets.labels.exports import CHOICE, read_export
from dgx_assets.lake.files import partition_folder, partition_value
from dgx_assets.lake.store import Lake
from dgx_assets.production import review
from dgx_assets.reporting.docs_server import resolve

DOCS = "http://127.0.0.1:3001"
HOSTILE_BATCHES = ["lot#1", "a b", "100%", "é", "a/b", "?x=1&y", "..", ".hidden"]


def sha(n: int) -> str:
    return f"{n:064x}"


def test_least_certain_takes_the_nearest_the_threshold_with_ties_broken_by_sha256():
    rows = [
        {"sha256": sha(1), "defect_probability": 0.9},
        {"sha256": sha(5), "defect_probability": 0.35},  # margin 0.05, tied with sha 3 and 4
        {"sha256": sha(3), "defect_probability": 0.45},
        {"sha256": sha(4), "defect_probability": 0.35},
        {"sha256": sha(2), "defect_probability": 0.4},  # on the threshold
        {"sha256": sha(6), "defect_probability": None},  # not scored
        {"sha256": sha(7), "defect_probability": float("nan")},
        {"sha256": sha(2), "defect_probability": 0.4},  # the same image landed twice: queued once
    ]
    picked = review.least_certain(rows, threshold=0.4, size=3)
    assert [row["sha256"] for row in picked] == [sha(2), sha(3), sha(4)]
    assert [row["sha256"] for row in review.least_certain(reversed(rows), 0.4, 3)] == [sha(2), sha(3), sha(4)]
    assert [row["sha256"] for row in review.least_certain(rows, 0.4, 10)] == [sha(2), sha(3), sha(4), sha(5), sha(1)]
    assert review.least_certain(rows, 0.4, 0) == [] and review.least_certain([], 0.4) == []


def test_tasks_link_the_served_files_and_predict_the_model_class_scored_by_its_margin():
    queued = [
        {"sha256": sha(1), "path": "file:/landing/b1/x.png", "defect_probability": 0.4},  # on the threshold: defective
        {"sha256": sha(2), "path": "file:/landing/b1/y.jpg", "defect_probability": 0.1},
    ]
    extensions = {sha(1): "png", sha(2): "jpg"}
    tasks = review.label_studio_tasks(queued, ["functional", "defective"], DOCS, "b1", "dgx-defect 7", 0.4, extensions)
    assert tasks[1] == {
        "data": {
            "image": f"{DOCS}/review_queue/batch%3Db1/images/{sha(2)}.jpg",
            "path": "file:/landing/b1/y.jpg",
            "sha256": sha(2),
            "saliency": f"{DOCS}/review_queue/batch%3Db1/saliency/{sha(2)}.png",
        },
        "predictions": [
            {
                "model_version": "dgx-defect 7",
                "score": 0.3,
                "result": [{"from_name": CHOICE, "to_name": "image", "type": "choices", "value": {"choices": ["functional"]}}],
            }
        ],
    }
    assert tasks[0]["predictions"][0]["score"] == 0 and tasks[0]["predictions"][0]["result"][0]["value"] == {
        "choices": ["defective"]
    }
    with pytest.raises(ValueError, match="two-class"):
        review.label_studio_tasks(queued, ["a", "b", "c"], DOCS, "b1", "7", 0.4, extensions)
    with pytest.raises(ValueError, match="not a sha256"):
        hostile = {"sha256": "../../etc/passwd", "path": "x", "defect_probability": 0.4}  # a sha256 names files: only hex
        review.label_studio_tasks([hostile], CLASSES, DOCS, "b1", "7", 0.4, {hostile["sha256"]: "png"})


def test_the_labeling_config_escapes_odd_class_names_and_names_what_the_exports_read():
    names = ['a "quoted" <tag> & more', "it's", "裂纹 crack", "line\nbreak", "tab\tand ]]>"]
    config = review.labeling_config(names)
    view = ET.fromstring(config)
    choices = view.find("Choices")
    assert choices is not None and choices.get("name") == CHOICE and choices.get("choice") == "single"
    images = {image.get("name"): image.get("value") for image in view.iter("Image")}
    assert images == {"image": "$image", "saliency": "$saliency"} and choices.get("toName") == "image"
    assert [choice.get("value") for choice in choices.iter("Choice")] == names
    for bad in (["ok", "bell\x07"], ["same", "same"], [], [" "]):
        with pytest.raises(ValueError):
            review.labeling_config(bad)


@pytest.mark.parametrize("batch", HOSTILE_BATCHES)
def test_hostile_batch_names_stay_data_in_the_queue_addresses(batch):
    url = review.queue_url(DOCS, batch, *review.image_file(sha(1), "png"))
    parts = urlsplit(url)
    assert parts.query == "" and parts.fragment == "" and parts.netloc == "127.0.0.1:3001"
    segments = parts.path.split("/")
    assert len(segments) == 5 and unquote(segments[2]) == partition_folder(batch)
    assert partition_value(unquote(segments[2]).removeprefix("batch=")) == batch
    # and the docs server reads the address back as the queue's folder and file, nothing else
    assert resolve(parts.path) == ("review_queue", [partition_folder(batch), "images", f"{sha(1)}.png"])


@pytest.fixture
def queue_lake(tmp_path):
    return build_queue_lake(tmp_path / "lake", "lot#1 é", [0.9, 0.42, 0.3, 0.05, 0.55])


def _write(queue_lake, size: int = 20) -> Path:
    lake = Lake(str(queue_lake.root))
    queued = review.least_certain(queue_lake.scores, 0.4, size)
    uri = review.write_queue(
        lake, queue_lake.batch, queued, CLASSES, docs_url=DOCS, model_version="7", threshold=0.4, saliency=queue_lake.saliency
    )
    return Path(lake.fs_path(uri))


def test_the_queue_folder_holds_the_tasks_config_images_and_saliency_swapped_in_whole(queue_lake):
    folder = _write(queue_lake, size=3)
    assert folder == queue_lake.root / "review_queue" / partition_folder(queue_lake.batch)
    tasks = json.loads((folder / "tasks.json").read_text())
    assert [task["predictions"][0]["score"] for task in tasks] == [0.02, 0.1, 0.15]  # least sure first
    for task in tasks:
        sha256 = task["data"]["sha256"]
        image = next(folder.glob(f"images/{sha256}.*"))
        assert image.read_bytes() == queue_lake.images[sha256]  # raw_images' bytes
        assert task["data"]["image"].endswith(f"/images/{image.name}")
        assert (folder / "saliency" / f"{sha256}.png").read_bytes() == queue_lake.saliency[sha256]
    assert sorted(p.suffix for p in (folder / "images").iterdir()) == [".jpg", ".png", ".png"]  # the bytes' format
    assert ET.fromstring((folder / "labeling_config.xml").read_text()).find("Choices") is not None
    assert not [p for p in queue_lake.root.rglob(".*")], "a staging or previous folder was left"

    folder = _write(queue_lake, size=1)  # the next queue of the batch replaces this one
    assert len(json.loads((folder / "tasks.json").read_text())) == len(list((folder / "images").iterdir())) == 1
    assert not [p for p in queue_lake.root.rglob(".*")]


def test_a_queue_missing_an_image_or_its_saliency_is_not_written(queue_lake):
    lake = Lake(str(queue_lake.root))
    missing = [{"sha256": sha(9), "path": "file:/x.png", "defect_probability": 0.4}]
    for queued, saliency in ((missing, {sha(9): png(1)}), (queue_lake.scores, {})):
        with pytest.raises(ValueError, match="lacks"):
            review.write_queue(lake, "b", queued, CLASSES, docs_url=DOCS, model_version="7", threshold=0.4, saliency=saliency)
    assert not (queue_lake.root / "review_queue").exists()


# --- Label Studio's exports of the tasks, as its docs and an export of Label Studio 1.23 show them -------------


def _annotated(tasks: list[dict], labels: dict[str, str]) -> list[tuple[int, dict, str | None]]:
    """(task id, data, the reviewer's class or None: skipped) for each task."""
    return [(number, task["data"], labels.get(task["data"]["sha256"])) for number, task in enumerate(tasks, 1)]


def _json_export(annotated) -> str:
    tasks = []
    for number, data, label in annotated:
        result = [{"from_name": CHOICE, "to_name": "image", "type": "choices", "value": {"choices": [label]}}] if label else []
        annotation = {"id": number, "completed_by": 1, "result": result, "was_cancelled": label is None, "ground_truth": False}
        tasks.append({"id": number, "annotations": [annotation], "drafts": [], "predictions": [number], "data": data})
    return json.dumps(tasks)


def _flat(annotated) -> list[dict]:
    """JSON_MIN's and CSV's rows: the task's data, its id and the choice under the <Choices name>; skipped
    tasks left out."""
    meta = {"annotator": 1, "created_at": "2026-12-06T10:00:00Z", "updated_at": "2026-12-06T10:00:00Z", "lead_time": 3.5}
    return [{**data, "id": n, CHOICE: label, "annotation_id": n, **meta} for n, data, label in annotated if label]


def _json_min_export(annotated) -> str:
    return json.dumps(_flat(annotated))


def _csv_export(annotated) -> str:
    rows = _flat(annotated)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=sorted(rows[0]), quoting=csv.QUOTE_ALL)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@pytest.mark.parametrize(
    "export, name", [(_json_export, "export.json"), (_json_min_export, "export_min.json"), (_csv_export, "export.csv")]
)
def test_label_studio_exports_of_the_tasks_come_back_as_records_of_the_right_images(queue_lake, tmp_path, export, name):
    tasks = json.loads((_write(queue_lake) / "tasks.json").read_text())
    shas = [task["data"]["sha256"] for task in tasks]
    labels = {shas[0]: "defective", shas[1]: "functional", shas[3]: "functional"}  # shas[2] skipped
    (tmp_path / name).write_text(export(_annotated(tasks, labels)), encoding="utf-8")
    read = read_export(tmp_path / name)
    assert read.problems == []
    assert {(record.sha256, record.label) for record in read.records} == set(labels.items())
    assert {record.path for record in read.records} == {t["data"]["path"] for t in tasks if t["data"]["sha256"] in labels}


def test_the_import_command_names_a_batch_import_labels_accepts():
    from dgx_assets.labels.importer import SAFE_NAME

    for batch in ("lot#1", "a b", "100%", "é", "..", ".hidden", "line-3"):
        name = review.import_command(batch).rsplit(" ", 1)[-1]
        assert SAFE_NAME.fullmatch(name), (batch, name)
    assert review.import_command("line-3") == "dgx-assets import-labels EXPORT.json --batch line-3"
