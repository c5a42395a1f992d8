"""A Kubernetes manifest for a scale's DAPO job on a bare-metal Ascend cluster (seed 001: node IPs are
not known in advance, so the Ray head is found through a headless Service's DNS name).

Documents: a headless Service for the Ray head, and a Volcano Job (gang-scheduled: all `nodes` pods
start together or none does -- a 32-node job must never hold 31 nodes waiting for the last) with a
`head` task (1 pod: Ray head, waits for every worker to join, then runs verl's command) and a
`worker` task (nodes - 1 pods: Ray workers). Each pod requests the node's NPUs as the Ascend device
plugin's `huawei.com/Ascend910` resource, runs on the host network (HCCL over RoCE) and mounts the
shared volume that holds models/, data/ and runs/ -- the run directory the launcher collects.

What MindCluster's scheduler and device plugin read (Ascend/mindcluster-deploy samples:
samples/train/basic-training/ranktable/yaml/910b/a300t_a2_pytorch_vcjob.yaml, the A3 SuperPoD job
samples/train/resumable-training/fault-tolerance/ranktable/mindspore/Qwen3/yamls/ms_multinodes_acjob_superpod.yaml,
samples/inference/volcano/pytorch_acjob_infer_910b_softsharedev.yaml, k8s-deploy-tool/config/stormservice-config.yaml):
the `ring-controller.atlas: ascend-910b` label on the job and its pods, ASCEND_VISIBLE_DEVICES from the pod's
`huawei.com/Ascend910` annotation (ascend-docker-runtime, whole-card scheduling with Volcano), the
`accelerator-type` node selector (module-910b-8 on A2, module-a3-16-super-pod on A3) with `host-arch: huawei-arm`,
and on A3 the `sp-block` annotation: the job's dies form one logical SuperPoD block, so the rollout's EP group and
Megatron's collectives stay on the HCCS fabric.

Security: the pods run on the host network, so whatever Ray listens on is reachable from every node. Ray's
dashboard serves the Jobs API, which runs any command it is sent; bound to 0.0.0.0 it would be remote code execution
for anyone on the network. The head here runs verl itself (no Jobs API needed), so the dashboard binds to the
pod's loopback (`--dashboard-host 127.0.0.1`, not in the Service), and the cluster runs Ray's token authentication
(`RAY_AUTH_MODE=token`, Ray >= 2.52 `ray/_private/authentication`; docs.ray.io ray-security/token-auth) with the token
from a Secret the operator creates once per namespace -- `kubectl -n NS create secret generic SECRET
--from-literal=token="$(openssl rand -hex 32)"` -- so the GCS port every worker needs accepts no one without it.
"""
from __future__ import annotations

import copy
import re
import shlex

from harness.errors import BadInput

NPU_RESOURCE = "huawei.com/Ascend910"  # Ascend device plugin (MindCluster): one unit per device (die on A3)
RAY_PORT = 6379
DASHBOARD_PORT = 8265
SHARED_MOUNT = "/mnt/shared"
SHARED_CLAIM = "ascend-rl-harness-shared"
AUTH_SECRET = "ascend-rl-harness-ray-auth"  # Secret with key `token`: Ray's cluster token (see module docstring)
# MindCluster: label and node selector values per hardware profile (see module docstring for the samples).
RING_CONTROLLER = {"ring-controller.atlas": "ascend-910b"}
ACCELERATOR_TYPE = {"a2": "module-910b-8", "a3": "module-a3-16-super-pod"}
# RFC 1123 DNS label (Kubernetes namespace names), and an OCI image reference (registry[:port]/path[:tag][@digest]).
_PVC = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # RFC 1123 subdomain (object names such as PVCs)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_IMAGE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]{1,5})?"
                    r"(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?")


def check_namespace(namespace: str) -> str:
    """A Kubernetes namespace name (RFC 1123 label) or BadInput naming --namespace: it is written into the
    manifest and into the workers' shell command, so nothing else may pass (issue 16)."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise BadInput(f"--namespace {namespace!r}: not a Kubernetes namespace name (lowercase letters, digits and "
                       "'-', at most 63, starting and ending alphanumeric)")
    return namespace


def check_image(image: str) -> str:
    """An OCI image reference (registry[:port]/name[:tag][@sha256:digest]) or BadInput naming --image."""
    if not isinstance(image, str) or len(image) > 512 or not _IMAGE.fullmatch(image):
        raise BadInput(f"--image {image!r}: not a container image reference (registry/name:tag or name@sha256:...)")
    return image


def _name(scale) -> str:
    return f"dapo-{scale.name}".lower().replace("_", "-")


def _env(scale, run_dir: str, env: dict) -> list[dict]:
    out = [{"name": k, "value": str(v)} for k, v in env.items()]
    out += [{"name": "VERL_FILE_LOGGER_PATH", "value": f"{run_dir}/metrics.jsonl"},
            {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
            # HCCL binds to the pod's host IP on the host network; known only at run time
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            # Ray token authentication on every process of the cluster (GCS, raylets, dashboard, drivers)
            {"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": AUTH_SECRET, "key": "token"}}}]
    if scale.hardware.kind == "npu":
        # MindCluster: the device plugin writes the allocated devices into this annotation and ascend-docker-runtime
        # mounts exactly those (mindcluster-deploy a300t_a2_pytorch_vcjob.yaml)
        out.append({"name": "ASCEND_VISIBLE_DEVICES",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{NPU_RESOURCE}']"}}})
    return out


def _container(scale, image: str, role: str, command: str, env: list[dict]) -> dict:
    container = {"name": role, "image": image, "imagePullPolicy": "IfNotPresent", "workingDir": SHARED_MOUNT,
                 "command": ["bash", "-c", command], "env": copy.deepcopy(env),  # no YAML aliases
                 "volumeMounts": [{"name": "shared", "mountPath": SHARED_MOUNT},
                                  {"name": "dshm", "mountPath": "/dev/shm"}],
                 "ports": [{"containerPort": RAY_PORT, "name": "gcs"}]}
    if scale.hardware.kind == "npu":
        count = str(scale.devices_per_node)
        container["resources"] = {"requests": {NPU_RESOURCE: count}, "limits": {NPU_RESOURCE: count}}
    return container


def _pod(scale, image: str, role: str, command: str, env: list[dict], pvc: str = SHARED_CLAIM) -> dict:
    labels = {"app": _name(scale), "role": role}
    spec = {"restartPolicy": "Never", "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "automountServiceAccountToken": False,
            "containers": [_container(scale, image, role, command, env)],
            "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": pvc}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    if scale.hardware.kind == "npu":
        labels.update(RING_CONTROLLER)
        selector = {"host-arch": "huawei-arm"}
        if scale.hardware.name in ACCELERATOR_TYPE:
            selector["accelerator-type"] = ACCELERATOR_TYPE[scale.hardware.name]
        spec["nodeSelector"] = selector
    return {"metadata": {"labels": labels}, "spec": spec}


def manifest(scale, *, image: str = "verl-ascend:latest", namespace: str = "default",
             steps: int | None = None, pvc: str = SHARED_CLAIM, job=None) -> list[dict]:
    """The manifest documents (Service, Volcano Job) for a scale, as plain dicts. BadInput for a namespace, image or
    PVC name that is not one, or steps < 1. `pvc`: the claim mounted at SHARED_MOUNT in every pod (issue 15,
    point 6: the default is overridable). `job` (harness.config.job.Job): the user's recipe applied to the scale --
    its overrides, environment, nodes and devices; PlanError when its plan breaks a rule."""
    from harness.launch.ray_job import DEFAULT_STEPS_VERL, check_steps, verl_job

    check_namespace(namespace)
    check_image(image)
    if not isinstance(pvc, str) or len(pvc) > 253 or not _PVC.fullmatch(pvc):
        raise BadInput(f"--pvc {pvc!r}: not a PersistentVolumeClaim name (RFC 1123 subdomain: lowercase letters, "
                       "digits, '-' and '.', starting and ending alphanumeric)")
    steps = check_steps(steps)
    name = _name(scale)
    run_dir = f"{SHARED_MOUNT}/runs/{name}"
    # resume_mode=auto: a rescheduled head (seed 001's resumable K8s launch) continues from the checkpoints
    recipe = None
    if job is not None:
        if job.plan_error:
            from harness.errors import PlanError

            raise PlanError(f"{job.user.source if job.user else scale.name}: {job.plan_error}")
        scale, recipe = job.scale, job.recipe
    job = verl_job(scale, run_dir, steps=steps or DEFAULT_STEPS_VERL, resume=True, recipe=recipe)
    # verl_job resolves paths on this machine; on the cluster the run dir is the shared mount's
    env = _env(scale, run_dir, dict(job.env))
    head_host = f"{name}-head.{namespace}.svc.cluster.local"
    nodes = scale.nodes
    wait = (f"until [ \"$(python3 -c 'import ray; ray.init(address=\"auto\", logging_level=\"ERROR\"); "
            f"print(sum(n[\"Alive\"] for n in ray.nodes()))')\" -ge {nodes} ]; do sleep 10; done")
    head_cmd = " && ".join([
        "set -o pipefail",
        f"mkdir -p {shlex.quote(run_dir)}",
        # verl's FileLogger truncates metrics.jsonl on resume: keep the earlier segment (ingest merges them)
        f"{{ [ ! -s {shlex.quote(run_dir)}/metrics.jsonl ] || mv {shlex.quote(run_dir)}/metrics.jsonl "
        f"{shlex.quote(run_dir)}/metrics.seg$(date +%s).jsonl; }}",
        # the dashboard (and its Jobs API) only on the pod's loopback: see the module docstring
        f"ray start --head --port {RAY_PORT} --dashboard-host 127.0.0.1 --dashboard-port {DASHBOARD_PORT} "
        "--disable-usage-stats",
        wait,
        f"{job.entrypoint} 2>&1 | tee {shlex.quote(run_dir)}/job.log",
    ])
    worker_cmd = (f"until ray start --address {shlex.quote(f'{head_host}:{RAY_PORT}')} --disable-usage-stats --block; "
                  "do sleep 10; done")
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-head", "namespace": namespace},
               "spec": {"clusterIP": "None", "selector": {"app": name, "role": "head"},
                        "ports": [{"name": "gcs", "port": RAY_PORT}]}}
    tasks = [{"name": "head", "replicas": 1, "template": _pod(scale, image, "head", head_cmd, env, pvc),
              "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}]}]
    if nodes > 1:
        tasks.append({"name": "worker", "replicas": nodes - 1,
                      "template": _pod(scale, image, "worker", worker_cmd, env, pvc)})
    job_labels = {"app": name, "ascend-rl-harness/scale": scale.name}
    job_annotations = {}
    if scale.hardware.kind == "npu":
        job_labels.update(RING_CONTROLLER)
        if scale.hardware.name == "a3":
            # one logical SuperPoD block of all the job's dies (MindCluster sp-block, ms_multinodes_acjob_superpod)
            job_annotations["sp-block"] = str(scale.devices)
    volcano_job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                   "metadata": {"name": name, "namespace": namespace, "labels": job_labels,
                                **({"annotations": job_annotations} if job_annotations else {})},
                   "spec": {"schedulerName": "volcano", "minAvailable": nodes, "maxRetry": 0,
                            "policies": [{"event": "PodEvicted", "action": "AbortJob"},
                                         {"event": "PodFailed", "action": "AbortJob"}],
                            "tasks": tasks}}
    return [service, volcano_job]


def manifest_yaml(scale, **kw) -> str:
    """The manifest as multi-document YAML (what `launch --scale NAME --k8s` prints)."""
    import yaml

    return yaml.safe_dump_all(manifest(scale, **kw), sort_keys=False, default_flow_style=False, width=120)
