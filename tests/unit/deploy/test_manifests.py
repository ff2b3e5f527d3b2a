"""deploy/k8s: valid Kubernetes, secure pods, and names, ports and images that agree across files."""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from support.deploy_files import (
    DEPLOY,
    K8S_DIR,
    OUR_IMAGES,
    REPO,
    container_args,
    dockerfile,
    find,
    load_documents,
    manifest_documents,
    pod_spec,
    workloads,
)

from dgx_assets import k8s as dgx_k8s

# The oldest Kubernetes a DGX cluster is likely to run, and the newest schema the validator ships.
KUBERNETES_VERSIONS = ["1.30", kubernetes_validate.latest_version()]


def _id(item):
    return f"{item[0]}:{item[1]['kind']}/{item[1]['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", manifest_documents(), ids=_id)
def test_every_manifest_is_valid_kubernetes(item, version):
    _, doc = item
    kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field():
    # Guards the test above: a typo must not pass as "valid".
    deployment = copy.deepcopy(find("Deployment", "ernie-serving-gpu0"))
    pod_spec(deployment)["containers"][0]["resource"] = pod_spec(deployment)["containers"][0].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_and_the_serving_config():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {f"k8s/{path.name}" for path in K8S_DIR.glob("*.yaml")}
    [generator] = kustomization["configMapGenerator"]
    for file in generator["files"]:
        assert (DEPLOY / file).is_file(), f"{file} (the serving process's config) is missing under deploy/"
    # The serving pods mount the generated ConfigMap under the name the generator gives it.
    for name in ("ernie-serving-gpu0", "ernie-serving-gpu1"):
        volumes = {v["name"]: v for v in pod_spec(find("Deployment", name))["volumes"]}
        assert volumes["config"]["configMap"]["name"] == generator["name"]


def test_all_objects_live_in_the_two_project_namespaces():
    namespaces = {doc["metadata"]["name"] for _, doc in manifest_documents() if doc["kind"] == "Namespace"}
    assert namespaces == {"dgx-assets", "dgx-monitoring"}
    for _, doc in manifest_documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") in namespaces, f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_no_pod_runs_as_root_or_without_limits(workload):
    spec = pod_spec(workload)
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] > 0
    assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
    for container in spec["containers"] + spec.get("initContainers", []):
        security = container["securityContext"]
        assert security.get("runAsUser", pod_security["runAsUser"]) > 0
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in security or security["privileged"] is False
        limits = container["resources"]["limits"]
        assert {"cpu", "memory"} <= set(limits), f"{container['name']} lacks cpu/memory limits"
        gpu_request = container["resources"].get("requests", {}).get(dgx_k8s.GPU_RESOURCE)
        # Kubernetes requires extended resources to be requested exactly as limited.
        assert gpu_request == limits.get(dgx_k8s.GPU_RESOURCE)
        image = container["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"unpinned image {image}"
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    assert all("hostPath" not in volume for volume in spec.get("volumes", []))


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_gpu_pods_land_on_gpu_nodes(workload):
    spec = pod_spec(workload)
    wants_gpu = any(dgx_k8s.GPU_RESOURCE in c["resources"]["limits"] for c in spec["containers"])
    if wants_gpu or spec.get("runtimeClassName") == "nvidia":
        assert spec["nodeSelector"] == dgx_k8s.GPU_NODE_SELECTOR
        assert spec["tolerations"] == dgx_k8s.GPU_TOLERATIONS
        assert workload["kind"] == "DaemonSet" or workload["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_probes_and_mounts_refer_to_what_the_pod_declares(workload):
    spec = pod_spec(workload)
    volume_names = {volume["name"] for volume in spec.get("volumes", [])}
    for container in spec["containers"]:
        port_names = {port["name"] for port in container["ports"]}
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(probe_name)
            if probe:
                handler = probe.get("httpGet") or probe.get("tcpSocket")
                assert handler["port"] in port_names, f"{probe_name} of {container['name']}"
        assert container.get("readinessProbe") and container.get("livenessProbe"), container["name"]
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volume_names
        if container["securityContext"].get("readOnlyRootFilesystem"):
            # Something must stay writable for temp files.
            assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]}


def test_every_service_selects_pods_and_targets_their_ports():
    templates = [(w["metadata"]["namespace"], w["spec"]["template"]) for w in workloads()]
    for _, service in manifest_documents():
        if service["kind"] != "Service":
            continue
        namespace, selector = service["metadata"]["namespace"], service["spec"]["selector"]
        selected = [t for ns, t in templates if ns == namespace and selector.items() <= t["metadata"]["labels"].items()]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        for template in selected:
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]}
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in ports
                assert port["port"] == ports[port["targetPort"]], "Service port differs from container port"


def test_each_serving_deployment_owns_one_gpu_and_the_two_are_identical():
    gpu0, gpu1 = find("Deployment", "ernie-serving-gpu0"), find("Deployment", "ernie-serving-gpu1")
    for deployment, slot in ((gpu0, "0"), (gpu1, "1")):
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["template"]["metadata"]["labels"]["dgx-assets/gpu-slot"] == slot
        [container] = pod_spec(deployment)["containers"]
        assert container["resources"]["limits"][dgx_k8s.GPU_RESOURCE] == "1"
        assert container["resources"]["limits"]["memory"] == "32Gi"
        # Guaranteed QoS with whole CPUs: what the kubelet's static CPU manager pins (NUMA alignment).
        assert container["resources"]["requests"] == container["resources"]["limits"]
        assert re.fullmatch(r"\d+", container["resources"]["limits"]["cpu"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/status"
    # Apart from the slot, the twins must not drift apart.
    normalized = yaml.safe_dump(gpu1).replace("gpu1", "gpu0").replace("gpu-slot: '1'", "gpu-slot: '0'")
    assert yaml.safe_load(normalized) == gpu0


def test_serving_command_line_matches_ports_mounts_and_secret():
    deployment = find("Deployment", "ernie-serving-gpu0")
    [container] = pod_spec(deployment)["containers"]
    args = container_args(container)
    assert args["--host"] == "0.0.0.0"
    assert int(args["--port"]) == container["ports"][0]["containerPort"] == 9998
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    # The generated ConfigMap holds the file under its own name.
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    [config_file] = kustomization["configMapGenerator"][0]["files"]
    assert args["--config"] == f"{mounts['config']}/{config_file.rsplit('/', 1)[1]}"
    assert args["--model-dir"].startswith(mounts["models"] + "/")
    env = {item["name"]: item for item in container["env"]}
    token = env[args["--token-env"]]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "dgx-assets-secrets", "key": args["--token-env"]}


def test_serving_process_accepts_the_pod_command_line_and_config_file(tmp_path):
    """The real `dgx-assets serve` parser and config loader read what the pod passes them."""
    from dgx_assets.cli import build_parser
    from dgx_assets.serving.config import build_config

    [container] = pod_spec(find("Deployment", "ernie-serving-gpu0"))["containers"]
    parsed = build_parser().parse_args(["serve", *container["args"]])
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    [config_file] = kustomization["configMapGenerator"][0]["files"]
    config = build_config(
        str(DEPLOY / config_file), model_dir=parsed.model_dir, host=parsed.host, port=parsed.port, token_env=parsed.token_env
    )
    assert (config.host, config.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    assert config.model_dir == "/models/ernie" and config.token_env == "DGX_ERNIE_TOKEN"
    # Inside the pod the one GPU the device plugin gave it is GPU 0.
    assert config.gpu_ids[0] == 0
    # The image's default command line parses too.
    cmd = json.loads(_dockerfile_value(dockerfile("serving"), "CMD"))
    assert build_parser().parse_args(["serve", *cmd]).port == config.port


def test_sglang_serves_real_ernie_image_from_the_shared_model_volume():
    [container] = pod_spec(find("Deployment", "ernie-image-sglang"))["containers"]
    assert container["command"] == ["sglang", "serve"]
    args = container_args(container)
    assert args["--model-path"].startswith("/models/")
    assert int(args["--port"]) == container["ports"][0]["containerPort"]
    volumes = {v["name"]: v for v in pod_spec(find("Deployment", "ernie-image-sglang"))["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "ernie-models"


def test_triton_reads_the_model_repository_its_init_container_fetched():
    spec = pod_spec(find("Deployment", "triton"))
    [fetch] = spec["initContainers"]
    [container] = spec["containers"]
    args = container_args(container)
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert args["--model-repository"] == mounts["model-repository"]["mountPath"]
    assert mounts["model-repository"]["readOnly"] is True
    fetch_mounts = {mount["name"]: mount["mountPath"] for mount in fetch["volumeMounts"]}
    assert fetch["args"][-1] == fetch_mounts["model-repository"]  # where the script copies to
    assert fetch["envFrom"] == [{"configMapRef": {"name": "dgx-assets-env"}}]  # DGX_LAKE_ROOT
    assert args["--strict-model-config"] == "true"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (int(args["--http-port"]), int(args["--grpc-port"]), int(args["--metrics-port"])) == (
        ports["http"],
        ports["grpc"],
        ports["metrics"],
    )


def test_gpu_quota_covers_the_fixed_gpu_workloads():
    quota = int(find("ResourceQuota", "dgx-assets-gpus")["spec"]["hard"][f"requests.{dgx_k8s.GPU_RESOURCE}"])
    fixed = sum(
        int(c["resources"]["requests"].get(dgx_k8s.GPU_RESOURCE, 0)) * w["spec"].get("replicas", 1)
        for w in workloads()
        if w["metadata"]["namespace"] == "dgx-assets"
        for c in pod_spec(w)["containers"]
    )
    assert 0 < fixed < quota, "the quota must leave GPUs for Dagster steps and Spark executors"


def _service_url_target(url: str) -> tuple[dict, int]:
    parsed = urlparse(url)
    name, namespace = parsed.hostname.split(".")[:2]
    service = find("Service", name)
    assert service["metadata"]["namespace"] == namespace
    return service, parsed.port


def test_cluster_environment_points_at_the_services_it_deploys(env_configmap):
    assert env_configmap["DGX_DEPLOYMENT"] == "k8s"
    assert env_configmap["DGX_SPARK_MASTER"].startswith("k8s://https://")
    assert env_configmap["DGX_LAKE_ROOT"].startswith("hdfs://")
    service, port = _service_url_target(env_configmap["MLFLOW_TRACKING_URI"])
    assert port in {p["port"] for p in service["spec"]["ports"]}
    serving_services = set()
    for url in env_configmap["DGX_ERNIE_ENDPOINTS"].split(","):
        service, port = _service_url_target(url)
        assert port in {p["port"] for p in service["spec"]["ports"]}
        serving_services.add(service["metadata"]["name"])
    assert serving_services == {"ernie-serving-gpu0", "ernie-serving-gpu1"}


def test_prometheus_jobs_find_the_deployed_exporters():
    config = yaml.safe_load(find("ConfigMap", "prometheus-dgx-scrape")["data"]["prometheus.yml"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"dcgm-exporter", "ernie-serving", "triton"}
    for job in jobs.values():
        [sd] = job["kubernetes_sd_configs"]
        keeps = {tuple(rule["source_labels"]): rule["regex"] for rule in job["relabel_configs"] if rule.get("action") == "keep"}
        name_label = next(v for k, v in keeps.items() if k[0].endswith("_label_app_kubernetes_io_name"))
        port_name = next(v for k, v in keeps.items() if k[0].endswith("port_name"))
        targets = [w for w in workloads() if w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == name_label]
        assert targets, f"job {job['job_name']} keeps app {name_label!r}, which nothing deploys"
        for workload in targets:
            assert workload["metadata"]["namespace"] in sd["namespaces"]["names"]
            assert port_name in {p["name"] for c in pod_spec(workload)["containers"] for p in c["ports"]}
        if sd["role"] == "endpoints":
            assert any(
                doc["kind"] == "Service" and doc["metadata"]["labels"].get("app.kubernetes.io/name") == name_label
                for _, doc in manifest_documents()
            )


def _dockerfile_value(text: str, instruction: str) -> str:
    [value] = re.findall(rf"^{instruction}\s+(.+)$", text, flags=re.MULTILINE)
    return value.strip()


def test_our_images_have_one_name_and_version_everywhere(helm_values, env_configmap, project_version):
    expected = {f"dgx-assets/{name}:{project_version}" for name in OUR_IMAGES}
    in_manifests = {
        c["image"]
        for w in workloads()
        for c in pod_spec(w)["containers"] + pod_spec(w).get("initContainers", [])
        if c["image"].startswith("dgx-assets/")
    }
    [deployment] = helm_values["dagster-user-deployments"]["deployments"]
    in_helm = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    assert in_manifests | {in_helm, env_configmap["DGX_SPARK_IMAGE"]} == expected
    assert in_helm == env_configmap["DGX_SPARK_IMAGE"] == f"dgx-assets/code-location:{project_version}"
    for name in OUR_IMAGES:
        assert f"-t dgx-assets/{name}:{project_version}" in dockerfile(name), "build command in the Dockerfile header"


def test_dockerfiles_agree_with_the_pods_that_run_them(helm_values):
    serving = dockerfile("serving")
    [container] = pod_spec(find("Deployment", "ernie-serving-gpu0"))["containers"]
    assert int(_dockerfile_value(serving, "EXPOSE")) == container["ports"][0]["containerPort"]
    serving_pod = pod_spec(find("Deployment", "ernie-serving-gpu0"))
    assert int(_dockerfile_value(serving, "USER")) == serving_pod["securityContext"]["runAsUser"]
    assert '"dgx-assets", "serve"' in _dockerfile_value(serving, "ENTRYPOINT")

    code_location = dockerfile("code-location")
    [deployment] = helm_values["dagster-user-deployments"]["deployments"]
    assert int(_dockerfile_value(code_location, "EXPOSE")) == deployment["port"]
    assert int(_dockerfile_value(code_location, "USER")) == deployment["podSecurityContext"]["runAsUser"]
    import tomllib

    module = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dagster"]["module_name"]
    assert module == "dgx_assets.definitions"
    assert deployment["dagsterApiGrpcArgs"] == ["--module-name", module]
    assert f'"--module-name", "{module}"' in _dockerfile_value(code_location, "CMD")


def test_code_location_image_carries_what_the_spark_k8s_profile_expects(env_configmap):
    from dgx_assets.spark.profiles import profile_conf

    conf = profile_conf("k8s", env_configmap["DGX_SPARK_MASTER"])
    code_location = dockerfile("code-location")
    workdir = _dockerfile_value(code_location, "WORKDIR")
    # The discovery script the executors run exists in the repo and is copied to that path in the image.
    script = conf["spark.executor.resource.gpu.discoveryScript"]
    assert script.startswith(workdir + "/")
    relative = script[len(workdir) + 1 :]
    assert (REPO / relative).is_file()
    assert f"COPY {relative.rsplit('/', 1)[0]} ./{relative.rsplit('/', 1)[0]}" in code_location
    assert env_configmap["SPARK_CONF_DIR"] == f"{workdir}/{relative.rsplit('/', 1)[0]}"
    # Executors select GPU nodes with the same label the Dagster GPU steps and the manifests use.
    [(label, value)] = dgx_k8s.GPU_NODE_SELECTOR.items()
    assert conf[f"spark.kubernetes.executor.node.selector.{label}"] == value
    assert conf["spark.kubernetes.namespace"] == env_configmap["DGX_K8S_NAMESPACE"] == "dgx-assets"


def test_spark_driver_service_account_may_create_executor_pods(helm_values, dagster_yaml):
    binding = find("RoleBinding", "spark-driver")
    role = find("Role", binding["roleRef"]["name"])
    [subject] = binding["subjects"]
    assert subject["name"] == helm_values["global"]["serviceAccountName"]
    assert subject["name"] == dagster_yaml["run_launcher"]["config"]["service_account_name"]
    verbs = {verb for rule in role["rules"] if "pods" in rule["resources"] for verb in rule["verbs"]}
    assert {"create", "delete", "list", "watch"} <= verbs


def test_manifests_parse_as_plain_yaml_without_anchors():
    # Anchors do not cross YAML documents and some tools mishandle them: keep manifests explicit.
    for path in K8S_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            assert not re.search(r"(^|\s)[&*][A-Za-z]", code), f"{path.name}: {line}"
        assert load_documents(path)
