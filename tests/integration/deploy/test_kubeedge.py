"""The KubeEdge rollout: the generated Deployment is valid Kubernetes, pinned to edge nodes, secure and bounded,
and fetches one exact registered version; deploy/kubeedge/edge-deployment.yaml is what the generator writes."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dgx_assets import cli
from dgx_assets.fleet.kubeedge import EDGE_ROLE_LABEL, edge_deployment, render

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "deploy" / "kubeedge" / "edge-deployment.yaml"
KUBERNETES_VERSIONS = ["1.30", kubernetes_validate.latest_version()]

sys.path.insert(0, str(REPO / "tests" / "edge"))
from support.edge_data import registered_version  # noqa: E402, F401 (a fixture: a real MLflow store with version 1)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_example_is_the_generators_output_and_valid_kubernetes(version):
    example = yaml.safe_load(EXAMPLE.read_text())
    model_name, model_version = example["metadata"]["annotations"]["dgx-assets/registered-model"].split("/")
    assert EXAMPLE.read_text() == render(edge_deployment(model_name, model_version)), (
        "regenerate: dgx-assets edge-manifest --version N --out deploy/kubeedge/edge-deployment.yaml"
    )
    kubernetes_validate.validate(example, version, strict=True)


def test_pods_go_only_to_edge_nodes_as_non_root_with_limits():
    spec = edge_deployment("dgx_defect_classifier", "7")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {EDGE_ROLE_LABEL: ""}
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": EDGE_ROLE_LABEL, "operator": "Exists"}]
    assert {"key": EDGE_ROLE_LABEL, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert not spec.get("hostNetwork")
    for container in spec["initContainers"] + spec["containers"]:
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert ":" in container["image"] and not container["image"].endswith(":latest")
    [fetch] = spec["initContainers"]
    assert fetch["command"] == ["dgx-assets", "edge-fetch"]
    assert fetch["args"][fetch["args"].index("--version") + 1] == "7"
    [runtime] = spec["containers"]
    model_dir = fetch["args"][fetch["args"].index("--out") + 1]
    assert runtime["args"][runtime["args"].index("--model-dir") + 1] == model_dir
    assert runtime["readinessProbe"]["httpGet"]["port"] == runtime["ports"][0]["name"]
    # The runtime's flags are real edge-run flags.
    cli.build_parser().parse_args(runtime["command"][1:] + runtime["args"])
    cli.build_parser().parse_args(fetch["command"][1:] + fetch["args"])


def test_a_misspelt_field_fails_validation():
    deployment = edge_deployment("m", "1")
    deployment["spec"]["template"]["spec"]["nodeSelecter"] = deployment["spec"]["template"]["spec"].pop("nodeSelector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_an_alias_is_never_pinned():
    with pytest.raises(ValueError, match="pin a registered version number"):
        edge_deployment("m", "champion")


def test_edge_manifest_pins_the_current_champion_version(registered_version, tmp_path, capsys):  # noqa: F811
    from mlflow import MlflowClient

    out = tmp_path / "edge-deployment.yaml"
    argv = [
        "edge-manifest",
        "--model-name",
        registered_version.model_name,
        "--out",
        str(out),
        "--tracking-uri",
        registered_version.tracking_uri,
    ]
    assert cli.main(argv) == 2 and "no 'champion' version" in capsys.readouterr().err
    MlflowClient(registered_version.tracking_uri).set_registered_model_alias(
        registered_version.model_name, "champion", registered_version.version
    )
    assert cli.main(argv) == 0
    deployment = yaml.safe_load(out.read_text())
    kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    assert (
        deployment["metadata"]["annotations"]["dgx-assets/registered-model"]
        == f"{registered_version.model_name}/{registered_version.version}"
    )


def test_edge_manifest_labels_the_format_edge_model_shipped(registered_version, tmp_path, capsys):  # noqa: F811
    from mlflow import MlflowClient

    client = MlflowClient(registered_version.tracking_uri)
    name, version = registered_version.model_name, registered_version.version
    argv = ["edge-manifest", "--model-name", name, "--version", version, "--out", str(tmp_path / "edge.yaml")]
    argv += ["--tracking-uri", registered_version.tracking_uri]
    assert cli.main(argv) == 0 and "no edge model recorded for it" in capsys.readouterr().out
    assert "dgx-assets/edge-format" not in yaml.safe_load((tmp_path / "edge.yaml").read_text())["metadata"]["labels"]

    # What edge_model records when it builds the version's edge model (edge/build.py, edge/fetch.py).
    digest = "ab" * 32
    client.set_tag(registered_version.run_id, "dgx.edge_model.format", "float16")
    client.set_model_version_tag(name, version, "dgx.edge_model.sha256", digest)
    assert cli.main(argv) == 0 and "edge format float16" in capsys.readouterr().out
    deployment = yaml.safe_load((tmp_path / "edge.yaml").read_text())
    kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    assert deployment["metadata"]["labels"]["dgx-assets/edge-format"] == "float16"
    assert deployment["spec"]["template"]["metadata"]["labels"]["dgx-assets/edge-format"] == "float16"
    assert deployment["metadata"]["annotations"]["dgx-assets/edge-model-sha256"] == digest
