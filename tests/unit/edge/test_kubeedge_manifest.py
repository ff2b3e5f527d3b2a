"""`edge-manifest` with hostile or careless input: whatever a user passes stays a value in the YAML, and a bad
--out is one line of error with nothing left behind."""

from __future__ import annotations

import os

import pytest
import yaml

from dgx_assets import cli
from dgx_assets.fleet.kubeedge import HEADER, edge_deployment, render


def manifest(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    code = cli.main(["edge-manifest", "--version", "3", "--out", str(tmp_path / "edge.yaml"), *extra])
    return code, capsys.readouterr().err


def test_a_model_name_that_is_yaml_stays_a_value_and_never_reaches_the_header(tmp_path, capsys):
    """Was: `--model-name $'m\\nhostNetwork: true\\n#'` added a hostNetwork key through the header comment."""
    name = "m: x # hostNetwork: true\n---\nkind: ClusterRoleBinding"
    code, err = manifest(tmp_path, capsys, "--model-name", name)
    assert code == 2 and "model name" in err and len(err.splitlines()) == 1  # a control character: refused
    for name in ("m: x # hostNetwork: true", "--- {kind: ClusterRoleBinding}", "'\"&anchor *alias !!python/object"):
        code, err = manifest(tmp_path, capsys, "--model-name", name)
        assert code == 0, err
        text = (tmp_path / "edge.yaml").read_text()
        assert text.startswith(HEADER)
        [document] = list(yaml.safe_load_all(text))
        assert sorted(document) == ["apiVersion", "kind", "metadata", "spec"] and document["kind"] == "Deployment"
        assert document["metadata"]["annotations"]["dgx-assets/registered-model"] == f"{name}/3"
        [fetch] = document["spec"]["template"]["spec"]["initContainers"]
        assert fetch["args"][fetch["args"].index("--model-name") + 1] == name


@pytest.mark.parametrize("version", ["³", "٣٤", "3\n", " 3", "-1", "1e3", "champion", "12345678901"])
def test_a_version_is_ascii_digits(version):
    """Was: versions in non-ASCII digits (`³`, `٣٤`) reached the labels."""
    with pytest.raises(ValueError, match="pin a registered version number in digits 0-9"):
        edge_deployment("m", version)


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--namespace", "dgx\nassets", "namespace"),
        ("--image", "img:1\n  hostNetwork: true", "image"),
        ("--pod-tracking-uri", "http://mlflow:5000\nx", "tracking URI"),
    ],
)
def test_other_values_that_could_be_read_as_more_than_a_value_are_refused(tmp_path, capsys, flag, value, words):
    code, err = manifest(tmp_path, capsys, flag, value)
    assert code == 2 and words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "edge.yaml").exists()


def test_out_problems_are_one_line_errors_and_leave_no_temporary_file(tmp_path, capsys):
    """Was: --out under a file or at a folder ended in a traceback and left `.<name>.<pid>` behind."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out, words in ((a_file / "edge.yaml", "cannot write it"), (tmp_path, "is a folder")):
        code = cli.main(["edge-manifest", "--version", "3", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == ["a-file", "dgx"]  # dgx: the test state folder


def test_a_missing_folder_is_created_and_the_write_replaces_the_file_whole(tmp_path, capsys):
    out = tmp_path / "new" / "edge.yaml"
    assert cli.main(["edge-manifest", "--version", "4", "--out", str(out)]) == 0
    assert out.read_text() == render(edge_deployment("dgx_defect_classifier", "4"))
    assert os.listdir(out.parent) == ["edge.yaml"]
