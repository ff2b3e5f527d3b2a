"""Dagster on Kubernetes: the instance config, the Helm values, the run queue and the GPU step tags,
checked with dagster's and dagster-k8s's own schemas and code (no cluster needed).

The `dagster._` imports are Dagster's own config validators and run-queue daemon: no public API checks an
instance config or drains a queue without a running deployment, and these tests exist to run Dagster's checks."""

from __future__ import annotations

import functools
import json

import dagster as dg
import jsonschema
import kubernetes
import kubernetes_validate
import pytest
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._serdes.config_class import class_from_code_pointer
from dagster_k8s import K8sRunLauncher
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)
from support.deploy_files import DEPLOY

from dgx_assets import k8s as dgx_k8s

K8S_VERSION = "1.30"


def test_instance_config_validates_against_dagsters_schema():
    config, custom_instance_class = dagster_instance_config(str(DEPLOY))
    assert custom_instance_class is None
    assert set(config["storage"]) == {"postgres"}
    assert config["telemetry"]["enabled"] is False


def test_run_launcher_config_validates_against_dagster_k8s(dagster_yaml):
    launcher = dagster_yaml["run_launcher"]
    assert class_from_code_pointer(launcher["module"], launcher["class"]) is K8sRunLauncher
    result = validate_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    # A misspelt key is an error, so passing above means something.
    broken = validate_config(K8sRunLauncher.config_type(), {**launcher["config"], "job_namespce": "x"})
    assert not broken.success


def test_queued_run_coordinator_config_validates(dagster_yaml):
    coordinator = dagster_yaml["run_coordinator"]
    assert class_from_code_pointer(coordinator["module"], coordinator["class"]) is QueuedRunCoordinator
    result = validate_config(QueuedRunCoordinator.config_type(), coordinator["config"])
    assert result.success, result.errors


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def test_helm_values_say_what_dagster_yaml_says(helm_values, dagster_yaml):
    launcher = dagster_yaml["run_launcher"]["config"]
    helm_launcher = helm_values["runLauncher"]["config"]["k8sRunLauncher"]
    assert helm_values["runLauncher"]["type"] == "K8sRunLauncher"
    assert helm_launcher["jobNamespace"] == launcher["job_namespace"]
    assert helm_launcher["imagePullPolicy"] == launcher["image_pull_policy"]
    assert [m["name"] for m in helm_launcher["envConfigMaps"]] == launcher["env_config_maps"]
    assert [s["name"] for s in helm_launcher["envSecrets"]] == launcher["env_secrets"]
    assert {_snake(k): v for k, v in helm_launcher["runK8sConfig"].items()} == launcher["run_k8s_config"]
    assert helm_values["global"]["postgresqlSecretName"] == launcher["postgres_password_secret"]

    coordinator = dagster_yaml["run_coordinator"]["config"]
    helm_coordinator = helm_values["dagsterDaemon"]["runCoordinator"]
    assert helm_coordinator["enabled"] and helm_coordinator["type"] == "QueuedRunCoordinator"
    queued = helm_coordinator["config"]["queuedRunCoordinator"]
    assert {_snake(k): v for k, v in queued.items()} == coordinator
    for section in ("run_monitoring", "run_retries"):
        helm_section = helm_values["dagsterDaemon"][section.replace("_m", "M").replace("_r", "R")]
        assert {_snake(k): v for k, v in helm_section.items()} == dagster_yaml[section]
    assert helm_values["telemetry"]["enabled"] is dagster_yaml["telemetry"]["enabled"] is False


def test_both_instance_configs_use_the_same_postgresql(helm_values, dagster_yaml, env_configmap):
    postgres = helm_values["postgresql"]
    assert postgres["enabled"] is False and helm_values["generatePostgresqlPasswordSecret"] is False
    db = dagster_yaml["storage"]["postgres"]["postgres_db"]
    from_env = {key: env_configmap[value["env"]] for key, value in db.items() if key != "password"}
    assert from_env == {
        "hostname": postgres["postgresqlHost"],
        "port": str(postgres["service"]["port"]),
        "db_name": postgres["postgresqlDatabase"],
        "username": postgres["postgresqlUsername"],
    }
    # dagster-k8s exposes the secret's password to run pods as DAGSTER_PG_PASSWORD.
    assert db["password"] == {"env": "DAGSTER_PG_PASSWORD"}


@functools.cache
def _k8s_definitions() -> dict:
    version = kubernetes_validate.latest_version()
    return kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )["$defs"]


def _validate_k8s_object(value, definition: str) -> None:
    # The chart's own values schema points these fields at the Kubernetes definitions; so do we.
    # (A validator without jsonschema.validate's check of the whole, large, schema: seconds faster.)
    jsonschema.Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": _k8s_definitions()}).validate(value)


@pytest.mark.parametrize(
    "path",
    [
        "dagsterWebserver",
        "dagsterDaemon",
        "dagster-user-deployments.deployments.0",
    ],
)
def test_helm_pod_settings_are_valid_kubernetes_objects(helm_values, path):
    section = helm_values
    for part in path.split("."):
        section = section[int(part)] if part.isdigit() else section[part]
    for key, definition in (
        ("resources", "io.k8s.api.core.v1.ResourceRequirements"),
        ("podSecurityContext", "io.k8s.api.core.v1.PodSecurityContext"),
        ("securityContext", "io.k8s.api.core.v1.SecurityContext"),
    ):
        _validate_k8s_object(section[key], definition)
        assert section[key], f"{path}.{key} is empty"
    assert section["podSecurityContext"]["runAsNonRoot"] is True
    assert {"cpu", "memory"} <= set(section["resources"]["limits"])
    for env_source in section.get("envConfigMaps", []) + section.get("envSecrets", []):
        _validate_k8s_object(env_source, "io.k8s.api.core.v1.ConfigMapEnvSource")


def test_gpu_step_tags_parse_as_dagster_k8s_container_config():
    @dg.asset(op_tags=dgx_k8s.gpu_step_tags(gpus=2, cpu="16", memory="128Gi"))
    def gpu_asset():
        return 1

    tags = gpu_asset.op.tags  # what k8s_job_executor reads for the step
    config = get_user_defined_k8s_config(tags)
    assert isinstance(config, UserDefinedDagsterK8sConfig)
    assert config.container_config["resources"]["limits"][dgx_k8s.GPU_RESOURCE] == "2"
    assert config.container_config["resources"]["requests"] == {"cpu": "16", "memory": "128Gi"}
    assert config.pod_spec_config["node_selector"] == dgx_k8s.GPU_NODE_SELECTOR
    assert config.pod_spec_config["tolerations"] == dgx_k8s.GPU_TOLERATIONS
    assert json.loads(tags[dgx_k8s.K8S_CONFIG_TAG]) == dgx_k8s.gpu_step_tags(2, "16", "128Gi")[dgx_k8s.K8S_CONFIG_TAG]


def test_gpu_step_pod_built_by_dagster_k8s_is_valid_and_gets_its_gpu(dagster_yaml, env_configmap):
    """The step's Job as dagster-k8s builds it: the launcher's run settings, then the step's tags."""
    launcher = validate_config(K8sRunLauncher.config_type(), dagster_yaml["run_launcher"]["config"]).value
    run_context = K8sContainerContext(
        image_pull_policy=launcher["image_pull_policy"],
        service_account_name=launcher["service_account_name"],
        env_config_maps=launcher["env_config_maps"],
        env_secrets=launcher["env_secrets"],
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(launcher["run_k8s_config"]),
        namespace=launcher["job_namespace"],
    )
    step_context = run_context.merge(
        K8sContainerContext(
            run_k8s_config=get_user_defined_k8s_config(
                {dgx_k8s.K8S_CONFIG_TAG: json.dumps(dgx_k8s.gpu_step_tags()[dgx_k8s.K8S_CONFIG_TAG])}
            )
        )
    )
    job_config = DagsterK8sJobConfig(
        job_image=env_configmap["DGX_SPARK_IMAGE"],
        dagster_home=launcher["dagster_home"],
        instance_config_map=launcher["instance_config_map"],
        postgres_password_secret=launcher["postgres_password_secret"],
        image_pull_policy=launcher["image_pull_policy"],
    )
    job = construct_dagster_k8s_job(
        job_config,
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-trained-model",
        user_defined_k8s_config=step_context.run_k8s_config,
        component="step_worker",
    )
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    manifest.update(apiVersion="batch/v1", kind="Job")
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)

    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"][dgx_k8s.GPU_RESOURCE] == "1"
    assert container["resources"]["limits"]["memory"] == "64Gi"  # the step's, over the run default
    assert pod["nodeSelector"] == dgx_k8s.GPU_NODE_SELECTOR
    assert pod["tolerations"] == dgx_k8s.GPU_TOLERATIONS
    assert pod["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["runAsUser"] == 10001
    assert pod["serviceAccountName"] == "dagster"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert {e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e} >= {"dgx-assets-env"}


@pytest.mark.parametrize("bad", [dict(gpus=0), dict(gpus=1.5), dict(gpus=True), dict(cpu="eight"), dict(memory="64GB")])
def test_gpu_step_tags_refuse_bad_amounts(bad):
    with pytest.raises(ValueError):
        dgx_k8s.gpu_step_tags(**bad)


def test_run_queue_tags_are_the_ones_the_coordinator_limits(dagster_yaml):
    limits = {
        (limit["key"], limit.get("value")): limit["limit"]
        for limit in dagster_yaml["run_coordinator"]["config"]["tag_concurrency_limits"]
    }
    [(key, training)] = dgx_k8s.TRAINING_RUN_TAGS.items()
    [(_, interactive)] = dgx_k8s.INTERACTIVE_RUN_TAGS.items()
    assert key == dgx_k8s.RUN_QUEUE_TAG
    assert limits[(key, training)] == 1
    assert 1 < limits[(key, interactive)] < dagster_yaml["run_coordinator"]["config"]["max_concurrent_runs"]


def test_daemon_dequeues_training_fifo_and_interactive_within_its_share(dagster_yaml):
    """The real QueuedRunCoordinator daemon's dequeue decision under deploy/dagster.yaml's limits."""
    location = GrpcServerCodeLocationOrigin(host="dgx-assets", port=3030, location_name="dgx_assets")
    repository = RemoteRepositoryOrigin(code_location_origin=location, repository_name="__repository__")
    tags = {"train": dgx_k8s.TRAINING_RUN_TAGS, "ui": dgx_k8s.INTERACTIVE_RUN_TAGS, "sensor": {}}
    with instance_for_test(overrides={"run_coordinator": dagster_yaml["run_coordinator"]}) as instance:
        names = {}

        def submit(name: str, status=DagsterRunStatus.QUEUED):
            run = create_run_for_test(
                instance,
                job_name=name,
                status=status,
                tags=tags[name.split("-")[0]],
                remote_job_origin=RemoteJobOrigin(repository_origin=repository, job_name=name),
            )
            names[run.run_id] = name
            return run

        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)

        def dequeued() -> list[str]:
            return [names[run.run_id] for run in daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)]

        for name in ["train-1", "ui-1", "train-2", "ui-2", "ui-3", "ui-4", "train-3", "sensor-1"]:
            submit(name)
        # One training run; the others wait in order. Interactive runs pass them, up to their share.
        assert dequeued() == ["train-1", "ui-1", "ui-2", "ui-3", "sensor-1"]

    with instance_for_test(overrides={"run_coordinator": dagster_yaml["run_coordinator"]}) as instance:
        names = {}
        submit("train-1", DagsterRunStatus.STARTED)
        submit("ui-1", DagsterRunStatus.STARTED)
        for name in ["train-2", "train-3", "ui-2", "ui-3", "ui-4"]:
            submit(name)
        # While a training run holds the GPUs none starts; the interactive share counts running ones.
        assert dequeued() == ["ui-2", "ui-3"]
        instance.report_run_canceled(instance.get_run_by_id(next(i for i, n in names.items() if n == "train-1")))
        assert dequeued()[0] == "train-2", "the oldest waiting training run goes next"
