"""Every bad input: one line on stderr naming the problem, exit 2, and the landing zone untouched."""

from __future__ import annotations

import json
import os
import stat
import zipfile

import pytest

from dgx_assets import cli


def refused(label_lake, capsys, source, *extra) -> list[str]:
    before = label_lake.landing_files()
    assert cli.main(label_lake.cli(str(source), "--batch", "inspection", *extra)) == 2
    assert label_lake.landing_files() == before  # nothing written, not even a hidden folder
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("import-labels: nothing written")
    return lines[:-1]


def json_min(tmp_path, *rows, name="export.json"):
    path = tmp_path / name
    path.write_text(json.dumps(list(rows)))
    return path


def test_a_label_the_model_does_not_know_unless_allowed(label_lake, tmp_path, capsys):
    source = json_min(tmp_path, {"id": 1, "sha256": label_lake.sha["a.png"], "choice": "cracked"})
    (line,) = refused(label_lake, capsys, source)
    assert "task 1: label 'cracked' is not one the model knows (defective, functional); --allow-new-labels" in line
    assert cli.main(label_lake.cli(str(source), "--batch", "inspection", "--allow-new-labels")) == 0
    (batch,) = os.listdir(label_lake.landing)
    assert (label_lake.landing / batch / "cracked" / "a.png").read_bytes() == label_lake.images["a.png"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"sha256": "f" * 64}, "the image with sha256 ffff"),
        ({"path": "/etc/passwd"}, "the image /etc/passwd is not in the lake's raw_images table"),
        ({"image": "../../b1/defective/a.png"}, "the image ../../b1/defective/a.png is not in the lake's raw_images table"),
        (
            {"sha256": "0" * 64},
            "the image with sha256 " + "0" * 64 + " is in raw_images as 'corrupted', with no content to import",
        ),
    ],
)
def test_an_image_the_lake_does_not_hold(label_lake, tmp_path, capsys, row, message):
    (line,) = refused(label_lake, capsys, json_min(tmp_path, {"id": 3, "choice": "defective"} | row))
    assert f"task 3: {message}" in line


def test_conflicting_and_duplicate_tasks(label_lake, tmp_path, capsys):
    a, b = label_lake.sha["a.png"], label_lake.sha["b.png"]
    one_task = [
        {
            "id": 1,
            "data": {"sha256": a},
            "annotations": [
                {"result": [{"type": "choices", "value": {"choices": [label]}}], "was_cancelled": False}
                for label in ("defective", "functional")
            ],
        }
    ]
    (tmp_path / "conflict.json").write_text(json.dumps(one_task))
    (line,) = refused(label_lake, capsys, tmp_path / "conflict.json")
    assert "task 1: conflicting annotations of one image: defective, functional" in line
    source = json_min(
        tmp_path,
        {"id": 1, "sha256": a, "choice": "defective"},
        {"id": 2, "path": label_lake.paths["a.png"], "choice": "defective"},
        {"id": 3, "sha256": b, "choice": "functional"},
        {"id": 4, "sha256": b, "choice": "defective"},
    )
    duplicate, conflict = refused(label_lake, capsys, source)
    assert "task 2: a duplicate task for the image" in duplicate and "task 1 has 'defective'" in duplicate
    assert "task 4: conflicting labels for the image" in conflict


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.json", "[]", "the Label Studio JSON_MIN export holds no labelled image"),
        ("empty.csv", "image,sha256,choice\n", "the Label Studio CSV export holds no labelled image"),
        ("bad.json", '[{"data": ', "malformed JSON: Expecting value"),
        ("bad.csv", "sha256,choice\nabc,defective,extra\n", "malformed CSV: a row's field count differs"),
        ("quote.csv", 'sha256,choice\n"abc,defective\n', "malformed CSV: unexpected end of data"),
        ("noimage.csv", "name,choice\nx,defective\n", "no `sha256`, `path` or `image` column"),
        ("nochoice.json", '[{"sha256": "x", "verdict": "defective"}]', "no `choice` column"),
        ("two.json", '[{"sha256": "x", "choice": {"choices": ["a", "b"]}}]', "several choices ['a', 'b'] in one answer"),
    ],
)
def test_an_empty_or_malformed_export(label_lake, tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    (line,) = refused(label_lake, capsys, tmp_path / name)
    assert message in line


def test_unsafe_zips(label_lake, tmp_path, capsys):
    image = label_lake.images["a.png"]
    with zipfile.ZipFile(tmp_path / "paths.zip", "w") as archive:
        archive.writestr("/defective/a.png", image)
        archive.writestr("defective/../../a.png", image)
        link = zipfile.ZipInfo("defective/link.png")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    absolute, dotdot, symlink = refused(label_lake, capsys, tmp_path / "paths.zip")
    assert "/defective/a.png: an absolute or `..` path in the zip" in absolute
    assert "defective/../../a.png: an absolute or `..` path" in dotdot
    assert "defective/link.png: a symbolic link in the zip" in symlink
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("defective/a.png", b"\0" * 5_000_000)
    (line,) = refused(label_lake, capsys, tmp_path / "bomb.zip")
    assert "unpack to 5000000, over a ratio of 100 (a zip bomb?)" in line


def test_a_cvat_folder_with_a_link_or_a_deeper_file(label_lake, tmp_path, capsys):
    folder = tmp_path / "cvat"
    (folder / "defective" / "deeper").mkdir(parents=True)
    (folder / "defective" / "a.png").write_bytes(label_lake.images["a.png"])
    (folder / "defective" / "deeper" / "b.png").write_bytes(label_lake.images["b.png"])
    (folder / "defective" / "link.png").symlink_to("/etc/passwd")
    link, deeper = refused(label_lake, capsys, folder)
    assert "defective/deeper/b.png: not <class>/<image file>" in deeper
    assert "defective/link.png: a symbolic link" in link


def test_a_cvat_image_the_lake_does_not_hold(label_lake, tmp_path, capsys):
    (tmp_path / "cvat" / "defective").mkdir(parents=True)
    (tmp_path / "cvat" / "defective" / "new.png").write_bytes(b"not in the lake")
    (line,) = refused(label_lake, capsys, tmp_path / "cvat")
    assert "defective/new.png: the image with sha256" in line and "is not in the lake's raw_images table" in line


def test_a_batch_name_that_is_not_a_folder_name(label_lake, tmp_path, capsys):
    source = json_min(tmp_path, {"sha256": label_lake.sha["a.png"], "choice": "defective"})
    before = label_lake.landing_files()
    assert cli.main(label_lake.cli(str(source), "--batch", "../escape")) == 2
    assert "--batch '../escape': use letters, digits" in capsys.readouterr().err
    assert label_lake.landing_files() == before


def test_a_lake_without_raw_images(tmp_path, capsys):
    source = json_min(tmp_path, {"sha256": "a" * 64, "choice": "defective"})
    argv = ["import-labels", str(source), "--batch", "x", "--lake", str(tmp_path / "empty"), "--landing", str(tmp_path / "l")]
    assert cli.main(argv) == 2
    assert "holds no raw_images rows: ingest a batch first" in capsys.readouterr().err
    assert not (tmp_path / "l").exists()
