"""The export formats, from real export files: Label Studio JSON, JSON_MIN, CSV, CVAT ImageNet folder and zip."""

from __future__ import annotations

import json
import zipfile

from dgx_assets.labels.exports import Record, ZipLimits, read_export

SHA_A, SHA_B = "a" * 64, "b" * 64


def task(number, data, *annotations):
    return {"id": number, "data": data, "annotations": list(annotations)}


def choice(label, cancelled=False, name="choice"):
    result = [{"type": "choices", "value": {"choices": [label]}, "from_name": name, "to_name": "image"}]
    return {"result": result, "was_cancelled": cancelled}


def test_label_studio_json_takes_choices_and_skips_cancelled_annotations(tmp_path):
    source = tmp_path / "export.json"
    tasks = [
        task(1, {"image": "/data/upload/1/a.png", "sha256": SHA_A.upper()}, choice("defective")),
        task(2, {"image": "/data/upload/1/b.png", "path": "file:/l/b1/x/b.png"}, choice("defective", True), choice("functional")),
        task(3, {"image": "/data/upload/1/c.png", "sha256": SHA_B}, choice("functional", cancelled=True)),  # only cancelled
        task(4, {"image": "/data/upload/1/d.png", "sha256": SHA_B}),  # never annotated
    ]
    source.write_text(json.dumps(tasks))
    export = read_export(source)
    assert export.format == "Label Studio JSON" and export.problems == []
    assert export.records == [
        Record("task 1", "defective", SHA_A, "/data/upload/1/a.png"),
        Record("task 2", "functional", None, "file:/l/b1/x/b.png"),
    ]


def test_label_studio_json_min_and_csv(tmp_path):
    rows = [
        {"id": 7, "image": "/data/a.png", "sha256": SHA_A, "choice": "defective"},
        {"id": 8, "image": "/data/b.png", "path": "/l/b1/x/b.png", "choice": {"choices": ["functional"]}},
    ]
    (tmp_path / "min.json").write_text(json.dumps(rows))
    export = read_export(tmp_path / "min.json")
    assert export.format == "Label Studio JSON_MIN" and export.problems == []
    assert [(r.where, r.label, r.sha256, r.path) for r in export.records] == [
        ("task 7", "defective", SHA_A, "/data/a.png"),
        ("task 8", "functional", None, "/l/b1/x/b.png"),
    ]
    csv_text = "id,image,path,sha256,verdict\n1,/data/a.png,,{a},defective\n"
    csv_text += '2,/data/b.png,/l/b.png,,"{{""choices"": [""functional""]}}"\n'
    (tmp_path / "export.csv").write_text(csv_text.format(a=SHA_A))
    export = read_export(tmp_path / "export.csv", choice="verdict")
    assert export.format == "Label Studio CSV" and export.problems == []
    assert [(r.label, r.sha256, r.path) for r in export.records] == [
        ("defective", SHA_A, "/data/a.png"),
        ("functional", None, "/l/b.png"),
    ]


def test_the_format_is_told_from_the_content_when_the_extension_says_nothing(tmp_path):
    (tmp_path / "export").write_text(json.dumps([{"sha256": SHA_A, "choice": "defective"}]))
    assert read_export(tmp_path / "export").format == "Label Studio JSON_MIN"
    (tmp_path / "export.txt").write_text(f"sha256,choice\n{SHA_A},defective\n")
    assert read_export(tmp_path / "export.txt").records == [Record("task 1", "defective", SHA_A, None)]


def test_cvat_imagenet_folder_and_zip_are_matched_by_content(tmp_path):
    import hashlib

    folder = tmp_path / "cvat"
    (folder / "defective").mkdir(parents=True)
    (folder / "functional").mkdir()
    (folder / "defective" / "x.png").write_bytes(b"one")
    (folder / "functional" / "y.png").write_bytes(b"two")
    (folder / "unlabelled.png").write_bytes(b"three")  # CVAT's place for images without a label
    expected = [
        Record("defective/x.png", "defective", hashlib.sha256(b"one").hexdigest()),
        Record("functional/y.png", "functional", hashlib.sha256(b"two").hexdigest()),
    ]
    export = read_export(folder)
    assert export.format == "CVAT ImageNet folder" and export.problems == []
    assert sorted(export.records, key=lambda r: r.where) == expected
    with zipfile.ZipFile(tmp_path / "cvat.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("defective/", "")
        archive.writestr("defective/x.png", b"one")
        archive.writestr("functional/y.png", b"two")
        archive.writestr("unlabelled.png", b"three")
    export = read_export(tmp_path / "cvat.zip")
    assert export.format == "CVAT ImageNet zip" and export.problems == []
    assert export.records == expected


def test_zip_limits_refuse_before_anything_is_decompressed(tmp_path):
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as archive:
        for n in range(5):
            archive.writestr(f"defective/{n}.png", b"x" * 100)
    assert read_export(tmp_path / "many.zip", limits=ZipLimits(members=4)).problems == [
        "the zip holds 5 files, over the limit of 4"
    ]
    assert (
        "over the limit of 300 (a zip bomb?)" in read_export(tmp_path / "many.zip", limits=ZipLimits(total_bytes=300)).problems[0]
    )
