"""deploy/spark: the GPU discovery script, spark-env.sh and spark-defaults.conf, run for real with bash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.deploy_files import DEPLOY

SPARK_DIR = DEPLOY / "spark"
DISCOVERY = SPARK_DIR / "gpu-discovery.sh"
# What the script needs besides nvidia-smi; the test PATH holds only these, so a real nvidia-smi on the
# test machine can never leak in.
TOOLS = ("bash", "awk", "grep", "tr", "hostname", "cat", "dirname")


@pytest.fixture
def tool_path(tmp_path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir


def fake_nvidia_smi(bin_dir: Path, indices: list[int]) -> None:
    # Answers only the query the script makes, in nvidia-smi's format for it.
    script = bin_dir / "nvidia-smi"
    lines = " ".join(str(i) for i in indices)
    script.write_text(
        "#!/bin/bash\n"
        '[[ "$*" == "--query-gpu=index --format=csv,noheader" ]] || { echo "unexpected: $*" >&2; exit 2; }\n'
        f"printf '%s\\n' {lines}\n"
    )
    script.chmod(0o755)


def discover(tool_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DISCOVERY)], env={"PATH": str(tool_path), **env}, capture_output=True, text=True, timeout=30)


def addresses(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    resource = json.loads(result.stdout)  # Spark parses stdout as exactly this JSON
    assert set(resource) == {"name", "addresses"} and resource["name"] == "gpu"
    return resource["addresses"]


def test_override_reports_the_given_gpus_as_json(tool_path):
    assert addresses(discover(tool_path, DGX_GPU_DISCOVERY_OVERRIDE="0,1,2,3")) == ["0", "1", "2", "3"]
    assert addresses(discover(tool_path, DGX_GPU_DISCOVERY_OVERRIDE=" 0 , 1,1")) == ["0", "1"]


def test_only_the_allowed_gpus_are_reported(tool_path):
    result = discover(tool_path, DGX_GPU_DISCOVERY_OVERRIDE="0,1,2,3,4,5,6,7", DGX_ALLOWED_GPUS="4,5")
    assert addresses(result) == ["4", "5"]
    assert result.stderr == ""


def test_nvidia_smi_is_asked_when_there_is_no_override(tool_path):
    fake_nvidia_smi(tool_path, list(range(8)))
    assert addresses(discover(tool_path)) == [str(i) for i in range(8)]
    assert addresses(discover(tool_path, DGX_ALLOWED_GPUS="5,4,5")) == ["5", "4"]


def test_allowed_gpu_that_is_absent_is_skipped_with_a_warning(tool_path):
    fake_nvidia_smi(tool_path, [0, 1])
    result = discover(tool_path, DGX_ALLOWED_GPUS="1,6")
    assert addresses(result) == ["1"]
    assert "allowed GPU 6 is not present" in result.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({}, "nvidia-smi not found and DGX_GPU_DISCOVERY_OVERRIDE not set"),
        ({"DGX_GPU_DISCOVERY_OVERRIDE": "0,gpu1"}, "'gpu1', which is not a GPU index"),
        ({"DGX_GPU_DISCOVERY_OVERRIDE": "0,1", "DGX_ALLOWED_GPUS": "4;5"}, "not a GPU index"),
        ({"DGX_GPU_DISCOVERY_OVERRIDE": "0,1", "DGX_ALLOWED_GPUS": "7"}, "no usable GPU"),
    ],
)
def test_bad_setups_fail_with_a_reason_and_print_nothing_spark_could_misread(tool_path, env, message):
    result = discover(tool_path, **env)
    assert result.returncode != 0
    assert result.stdout == ""
    assert message in result.stderr


def source_spark_env(tool_path: Path, **env: str) -> dict[str, str]:
    """The environment Spark's launch scripts get after sourcing spark-env.sh (they `set -a` first)."""
    command = f'set -a; . "{SPARK_DIR / "spark-env.sh"}"; set +a; env -0'
    result = subprocess.run(
        ["bash", "-c", command],
        env={"PATH": f"{tool_path}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(item.split("=", 1) for item in result.stdout.split("\0") if "=" in item)


def worker_opts(environment: dict[str, str]) -> dict[str, str]:
    opts = environment["SPARK_WORKER_OPTS"].split()
    return dict(opt[2:].split("=", 1) for opt in opts)


def test_spark_env_offers_the_allowed_gpus_with_this_discovery_script(tool_path):
    environment = source_spark_env(tool_path, DGX_ALLOWED_GPUS="4,5")
    opts = worker_opts(environment)
    assert opts["spark.worker.resource.gpu.amount"] == "2"
    assert Path(opts["spark.worker.resource.gpu.discoveryScript"]) == DISCOVERY
    assert os.access(DISCOVERY, os.X_OK)
    # Never exported empty: Spark reads "" as loopback / as a number and breaks.
    for variable in ("SPARK_LOCAL_IP", "SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY"):
        assert variable not in environment


def test_spark_env_counts_the_gpus_nvidia_smi_reports(tool_path):
    fake_nvidia_smi(tool_path, list(range(8)))
    assert worker_opts(source_spark_env(tool_path))["spark.worker.resource.gpu.amount"] == "8"


def test_spark_env_without_gpus_asks_for_none(tool_path):
    environment = source_spark_env(tool_path)
    assert "spark.worker.resource.gpu.amount" not in worker_opts(environment)
    assert environment["PYSPARK_PYTHON"]  # still set for CPU-only workers


def test_spark_env_keeps_what_the_operator_set(tool_path):
    environment = source_spark_env(
        tool_path,
        DGX_ALLOWED_GPUS="4,5",
        SPARK_WORKER_GPU_AMOUNT="1",
        SPARK_WORKER_DIR="/scratch/work",
        SPARK_WORKER_OPTS="-Dspark.worker.timeout=120",
    )
    opts = worker_opts(environment)
    assert opts["spark.worker.resource.gpu.amount"] == "1"
    assert opts["spark.worker.timeout"] == "120"
    assert environment["SPARK_WORKER_DIR"] == "/scratch/work"


def spark_defaults() -> dict[str, str]:
    entries = {}
    for line in (SPARK_DIR / "spark-defaults.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split(None, 1)
            assert key not in entries, f"{key} set twice"
            entries[key] = value.strip()
    return entries


def test_defaults_give_each_executor_one_gpu_shared_by_whole_tasks():
    conf = spark_defaults()
    assert conf["spark.executor.resource.gpu.amount"] == "1"
    tasks_per_gpu = 1 / float(conf["spark.task.resource.gpu.amount"])
    assert tasks_per_gpu == int(conf["spark.executor.cores"])  # GPU and cores run out together
    # Heartbeats must come well within the network timeout or busy executors get declared lost.
    seconds = {key: int(conf[key].rstrip("s")) for key in ("spark.network.timeout", "spark.executor.heartbeatInterval")}
    assert seconds["spark.executor.heartbeatInterval"] * 3 <= seconds["spark.network.timeout"]


@pytest.mark.parametrize(
    "deployment, master", [("standalone", "spark://dgx-01:7077"), ("k8s", "k8s://https://kubernetes.default.svc:443")]
)
def test_defaults_agree_with_the_spark_resource_profiles(deployment, master):
    from dgx_assets.spark.profiles import profile_conf

    profile = profile_conf(deployment, master)
    # Where they live differs per cluster (the event log dir comes from DGX_SPARK_EVENT_LOG).
    per_cluster = {"spark.eventLog.dir", "spark.history.fs.logDirectory", "spark.master"}
    shared = (set(profile) & set(spark_defaults())) - per_cluster
    assert {
        "spark.executor.resource.gpu.amount",
        "spark.task.resource.gpu.amount",
        "spark.executor.cores",
        "spark.executor.memory",
    } <= shared
    assert {key: spark_defaults()[key] for key in shared} == {key: profile[key] for key in shared}


def test_executor_pod_template_is_a_valid_non_root_gpu_pod():
    import kubernetes_validate
    import yaml

    from dgx_assets import k8s as dgx_k8s

    template = yaml.safe_load((SPARK_DIR / "executor-pod-template.yaml").read_text())
    kubernetes_validate.validate(template, "1.30", strict=True)
    spec = template["spec"]
    assert spec["nodeSelector"] == dgx_k8s.GPU_NODE_SELECTOR
    assert spec["tolerations"] == dgx_k8s.GPU_TOLERATIONS
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    [container] = spec["containers"]
    assert container["name"] == "executor"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_k8s_profile_uses_the_executor_pod_template():
    from dgx_assets.spark.profiles import profile_conf

    conf = profile_conf("k8s", "k8s://https://kubernetes.default.svc:443")
    key = "spark.kubernetes.executor.podTemplateFile"  # without it, executors would not tolerate GPU taints
    workdir = "/opt/dgx_assets/"
    assert conf[key].startswith(workdir) and (DEPLOY.parent / conf[key][len(workdir) :]).is_file()
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == "executor"
