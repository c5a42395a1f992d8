"""The K8s manifest's fields against the MindCluster samples it follows and the hardening it promises: the
rings-config ConfigMap with the ring-controller label, the schedule_policy annotation, the driver hostPath, the NPU
environment and Ray version check before `ray start`, cpu/memory requests and limits from the plan, a bounded
/dev/shm with Ray's object store inside it, a securityContext without capabilities, a pull policy by reference."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from harness.config.scales import get_scale
from harness.launch.k8s import (
    DEFAULT_IMAGE,
    NPU_RESOURCE,
    OBJECT_STORE_GIB,
    SHM_GIB,
    manifest_yaml,
    pod_resources,
    pull_policy,
)
from harness.memory.job_options import scale_options
from harness.memory.phases import host_offload_bytes

NPU_SCALES = ["full-a3", "full-a2-gbs128", "moonlight-a2", "reduced-a2"]


def _manifest(name: str, image: str = "img:1") -> list[dict]:
    return list(yaml.safe_load_all(manifest_yaml(get_scale(name), image=image, namespace="rl", steps=3)))


def _containers(job: dict):
    for task in job["spec"]["tasks"]:
        pod = task["template"]["spec"]
        (container,) = pod["containers"]
        yield task["name"], pod, container


def _gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize("name", NPU_SCALES)
def test_mindcluster_fields_as_in_its_samples(name):
    """mindcluster-deploy 910b/a800_pytorch_vcjob.yaml: a ring-controller job has its rings-config-<job> ConfigMap
    (hccl.json `initializing`, the same label, mounted at /user/serverid/devindex/config), a schedule_policy
    annotation, and the driver's hostPath; the A3 SuperPoD samples use chip2-node16-sp, an 8-NPU A2 node
    chip8-node8 (ascend-for-volcano constants.go)."""
    scale = get_scale(name)
    rings, service, job = _manifest(name)
    assert rings["kind"] == "ConfigMap" and rings["metadata"]["name"] == f"rings-config-{job['metadata']['name']}"
    assert rings["metadata"]["namespace"] == job["metadata"]["namespace"] == "rl"
    assert rings["metadata"]["labels"]["ring-controller.atlas"] == job["metadata"]["labels"]["ring-controller.atlas"]
    assert yaml.safe_load(rings["data"]["hccl.json"]) == {"status": "initializing"}
    policy = job["metadata"]["annotations"]["huawei.com/schedule_policy"]
    assert policy == {"a2": "chip8-node8", "a3": "chip2-node16-sp"}[scale.hardware.name]
    assert int(re.fullmatch(r"chip\d+-node(\d+)(-sp)?", policy).group(1)) == scale.devices_per_node
    for _, pod, container in _containers(job):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert volumes["ascend-driver"]["hostPath"]["path"] == mounts["ascend-driver"]["mountPath"] \
            == "/usr/local/Ascend/driver" and mounts["ascend-driver"]["readOnly"] is True
        assert volumes["ascend-910-config"]["configMap"]["name"] == rings["metadata"]["name"]
        assert mounts["ascend-910-config"]["mountPath"] == "/user/serverid/devindex/config"


@pytest.mark.parametrize("name", NPU_SCALES)
def test_ray_starts_after_the_npu_environment_and_a_ray_that_enforces_tokens(name):
    """`bash -c` sources nothing: CANN's and ATB's set_env.sh come first, then the Ray version check, then Ray."""
    *_, job = _manifest(name)
    for role, _, container in _containers(job):
        command = container["command"][2]
        steps = command.split(" && ")
        assert steps[:2] == ["source /usr/local/Ascend/ascend-toolkit/set_env.sh",
                             "source /usr/local/Ascend/nnal/atb/set_env.sh"], role
        assert steps[2].startswith("python3 -c ") and "RAY_AUTH_MODE=token" in steps[2]
        assert command.index("set_env.sh") < command.index("ray start"), role
        assert f"--object-store-memory {OBJECT_STORE_GIB << 30}" in command, role


def test_cpu_scale_sources_no_ascend_environment():
    *_, job = _manifest("tiny")
    (_, pod, container), = _containers(job)
    assert "set_env.sh" not in container["command"][2] and "RAY_AUTH_MODE=token" in container["command"][2]
    assert "ascend-driver" not in {v["name"] for v in pod["volumes"]}


def _version_check(ray_version: str, tmp_path) -> subprocess.CompletedProcess:
    *_, job = _manifest("full-a3")
    (_, _, container), *_ = _containers(job)
    check = container["command"][2].split(" && ")[2]
    fake = tmp_path / ray_version / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"__version__ = {ray_version!r}\n")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    return subprocess.run(["bash", "-c", check.replace("python3", sys.executable, 1)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_ray_check_refuses_the_vllm_ascend_images_ray(tmp_path):
    """Run for real against a `ray` of each version: 2.48 (vllm-ascend v0.23.0's Dockerfile pins <=2.48.0) stops the
    pod with the reason; 2.52, the stack's 2.60.0 and a local build pass."""
    old = _version_check("2.48.0", tmp_path)
    assert old.returncode == 1 and "ray 2.48.0 in this image ignores RAY_AUTH_MODE=token" in old.stderr
    for good in ("2.52.0", "2.60.0", "2.60+abc"):  # a local build's version crashed int() of its parts
        assert _version_check(good, tmp_path).returncode == 0, good


@pytest.mark.parametrize("name", [*NPU_SCALES, "tiny"])
def test_requests_and_limits_from_the_plan(name):
    """Every container requests and limits cpu and memory; on NPU the memory covers the plan's host-side offloads
    of the node's devices plus /dev/shm, and the NPU request equals its limit (the device plugin's rule)."""
    scale = get_scale(name)
    *_, job = _manifest(name)
    for _, _, container in _containers(job):
        res = container["resources"]
        assert res == pod_resources(scale, scale_options(scale))
        for key in ("cpu", "memory"):
            assert key in res["requests"] and key in res["limits"]
        assert _gib(res["requests"]["memory"]) <= _gib(res["limits"]["memory"])
        assert int(res["requests"]["cpu"]) <= int(res["limits"]["cpu"])
        if scale.hardware.kind == "npu":
            assert res["requests"][NPU_RESOURCE] == res["limits"][NPU_RESOURCE] == str(scale.devices_per_node)
            offload = scale.devices_per_node * host_offload_bytes(scale, scale_options(scale)) / 2**30
            assert _gib(res["requests"]["memory"]) >= offload + SHM_GIB


def test_host_offload_follows_the_plan():
    """Seed 001's offloads (params, grads, optimizer on the host) and sleep level 1's offloaded rollout weights:
    turning the offloads off leaves the rollout weights only; the 671B scales need hundreds of GiB per node."""
    from harness.memory.phases import rollout_weight_bytes

    scale = get_scale("full-a2-gbs128")
    none = scale_options(scale, param_offload=False, grad_offload=False, optimizer_offload=False)
    assert host_offload_bytes(scale, none) == rollout_weight_bytes(scale)
    assert scale.devices_per_node * host_offload_bytes(scale, scale_options(scale)) > 256 * 2**30
    tiny = get_scale("tiny")
    assert host_offload_bytes(tiny, scale_options(tiny)) == 0, "no sleep mode on CPU: no rollout weights offloaded"


@pytest.mark.parametrize("name", ["full-a3", "tiny"])
def test_shm_bounded_and_no_capabilities(name):
    *_, job = _manifest(name)
    for _, pod, container in _containers(job):
        (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}
        assert OBJECT_STORE_GIB < SHM_GIB, "a store larger than /dev/shm makes Ray fall back to /tmp"
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["automountServiceAccountToken"] is False


def test_pull_policy_by_reference():
    digest = "registry.local:5000/team/img@sha256:" + "0" * 64
    assert pull_policy(digest) == "IfNotPresent"
    assert pull_policy("verl-ascend:latest") == pull_policy("registry:5000/img") == "Always"
    # a versioned tag as MindCluster's samples pull it; the default, built on the nodes, was ImagePullBackOff
    assert pull_policy("img:1") == pull_policy("registry:5000/team/img:v2") == pull_policy(DEFAULT_IMAGE) == \
        "IfNotPresent"
    assert ":latest" not in DEFAULT_IMAGE
    *_, job = _manifest("full-a3", image=digest)
    assert {c["imagePullPolicy"] for _, _, c in _containers(job)} == {"IfNotPresent"}
    *_, job = _manifest("full-a3", image="verl-ascend:latest")
    assert {c["imagePullPolicy"] for _, _, c in _containers(job)} == {"Always"}, "no :latest with IfNotPresent"


def test_no_reschedule_claim():
    """maxRetry 0 with PodFailed/PodEvicted -> AbortJob never reschedules: the manifest must not promise it."""
    import harness.launch.k8s as k8s

    *_, job = _manifest("full-a3")
    assert job["spec"]["maxRetry"] == 0
    assert {p["action"] for p in job["spec"]["policies"]} == {"AbortJob"}
    assert "rescheduled head" not in open(k8s.__file__).read()


def test_a_users_recipe_reads_its_inputs_from_the_shared_mount():
    """`launch --k8s --recipe FILE` hands manifest() a job built without inputs: its recipe named the relative
    models/<name> and data/dapo, which no pod has (seeded: the job's recipe used as it came)."""
    from harness.config.job import build_job
    from harness.config.user_recipe import read_recipe
    from harness.launch.k8s import SHARED_MOUNT, manifest

    scale = get_scale("full-a3")
    user = read_recipe(overrides=["trainer.project_name=mine"])
    (*_, job) = manifest(scale, image="img:1", namespace="rl", steps=3, job=build_job(scale, user))
    command = " ".join(c["command"][-1] if isinstance(c.get("command"), list) else str(c.get("args", ""))
                       for _, _, c in _containers(job))
    assert f"actor_rollout_ref.model.path={SHARED_MOUNT}/models/{scale.model.name}" in command
    assert f"data.train_files={SHARED_MOUNT}/data/dapo/train.parquet" in command
    assert "trainer.project_name=mine" in command


def test_a_secret_hydra_override_reaches_the_pod_only_through_the_secret():
    """`+trainer.wandb_key=V` stood in clear in the pod's command (issue 48): the command carries an OmegaConf
    reference to an environment variable, and that variable comes from the Secret (seeded: the override kept as
    written puts the token into the manifest)."""
    import yaml

    from harness.config.job import build_job
    from harness.config.user_recipe import read_recipe
    from harness.launch.k8s import ENV_SECRET, manifest

    token = "wk-" + "7" * 24
    scale = get_scale("full-a3")
    job = build_job(scale, read_recipe(overrides=[f"+trainer.wandb_key={token}"]))
    documents = manifest(scale, image="img:1", namespace="rl", steps=3, job=job)
    assert token not in yaml.safe_dump_all(documents)
    (*_, vcjob) = documents
    containers = [c for _, _, c in _containers(vcjob)]
    # `$$`: the kubelet's own escape of `$` (kubelet_literal); the job's shell gets ${oc.env:...} for OmegaConf
    assert any("+trainer.wandb_key=$${oc.env:HARNESS_SECRET_TRAINER_WANDB_KEY}" in " ".join(map(str, c["command"]))
               for c in containers)
    assert all({"name": "HARNESS_SECRET_TRAINER_WANDB_KEY",
                "valueFrom": {"secretKeyRef": {"name": ENV_SECRET, "key": "HARNESS_SECRET_TRAINER_WANDB_KEY"}}}
               in c["env"] for c in containers)
