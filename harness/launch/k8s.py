"""A Kubernetes manifest for a scale's DAPO job on a bare-metal Ascend cluster (seed 001: node IPs are
not known in advance, so the Ray head is found through a headless Service's DNS name).

Documents: a headless Service for the Ray head, and a Volcano Job (gang-scheduled: all `nodes` pods
start together or none does -- a 32-node job must never hold 31 nodes waiting for the last) with a
`head` task (1 pod: Ray head, waits for every worker to join, then runs verl's command) and a
`worker` task (nodes - 1 pods: Ray workers). Each pod requests the node's NPUs as the Ascend device
plugin's `huawei.com/Ascend910` resource, runs on the host network (HCCL over RoCE) and mounts the
shared volume that holds models/, data/ and runs/ -- the run directory the launcher collects.

What MindCluster's scheduler and device plugin read (Ascend/mindcluster-deploy at 7d97fe3, the A2 job sample
samples/train/basic-training/ranktable/yaml/910b/a800_pytorch_vcjob.yaml -- the Atlas 800T A2 module template, not the
A300T card one --, the A3 SuperPoD samples samples/train/basic-training/without-ranktable/pytorch/
pytorch_multinodes_acjob_super_pod.yaml and samples/train/resumable-training/fault-tolerance/ranktable/mindspore/
Qwen3/yamls/ms_multinodes_acjob_superpod.yaml, samples/inference/volcano/pytorch_acjob_infer_910b_softsharedev.yaml):
the `ring-controller.atlas: ascend-910b` label on the job and its pods, paired as in every vcjob sample with the
`rings-config-<job>` ConfigMap (hccl.json, which the device plugin fills in; mounted at /user/serverid/devindex/config);
the `huawei.com/schedule_policy` annotation every sample carries (chip8-node8 for 8 NPUs on one HCCS ring, the Atlas
800T A2; chip2-node16-sp for 16 dies of a SuperPoD node, two per ring: Ascend/mind-cluster
component/ascend-for-volcano/common/util/constants.go); ASCEND_VISIBLE_DEVICES from the pod's `huawei.com/Ascend910`
annotation (ascend-docker-runtime, whole-card scheduling with Volcano); the /usr/local/Ascend/driver hostPath every
sample mounts; the `accelerator-type` node selector (module-910b-8 on A2, module-a3-16-super-pod on A3) with
`host-arch: huawei-arm`; and on A3 the `sp-block` annotation: the job's dies form one logical SuperPoD block, so the
rollout's EP group and Megatron's collectives stay on the HCCS fabric.

The pods start under `bash -c`, which sources nothing: the container first sources CANN's and ATB's set_env.sh (as
vllm-project/vllm-ascend v0.23.0's Dockerfile does, but only in its build steps), so torch_npu and ATB load in every
Ray worker, and refuses a Ray older than 2.52 (the vllm-ascend images pin ray<=2.48, which ignores RAY_AUTH_MODE=token
and would start an open cluster); docker/npu.Dockerfile builds the image with the stack's ray 2.60.0.

Security: the pods run on the host network, so whatever Ray listens on is reachable from every node. Ray's
dashboard serves the Jobs API, which runs any command it is sent; bound to 0.0.0.0 it would be remote code execution
for anyone on the network. The head here runs verl itself (no Jobs API needed), so the dashboard binds to the
pod's loopback (`--dashboard-host 127.0.0.1`, not in the Service), and the cluster runs Ray's token authentication
(`RAY_AUTH_MODE=token`, Ray >= 2.52 `ray/_private/authentication`; docs.ray.io ray-security/token-auth) with the token
from a Secret the operator creates once per namespace -- `kubectl -n NS create secret generic SECRET
--from-literal=token="$(openssl rand -hex 32)"` -- so the GCS port every worker needs accepts no one without it.
The containers drop every capability, may not escalate privileges and run under the runtime's default seccomp
profile (the securityContext of MindCluster's NPU pod sample samples/inference/volcano/mindie-ms/server.yaml): Ray
needs none (its ports are above 1024) and the NPUs come as devices, not capabilities. CPU and memory are requested
and limited (`pod_resources`), /dev/shm is bounded, and the image is pulled by digest or re-resolved every start.
Every `$` in a command or env value is doubled (kubelet's `$(VAR)` expansion, `kubelet_literal`), names are checked
against their grammar (RFC 1123), and a recipe's secret exports come from the Secret ENV_SECRET (one key per variable:
`kubectl -n NS create secret generic ascend-rl-harness-env --from-literal=HF_TOKEN=...`), never in clear.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import shlex

from harness.errors import BadInput

NPU_RESOURCE = "huawei.com/Ascend910"  # Ascend device plugin (MindCluster): one unit per device (die on A3)
RAY_PORT = 6379
DASHBOARD_PORT = 8265
SHARED_MOUNT = "/mnt/shared"
SHARED_CLAIM = "ascend-rl-harness-shared"
AUTH_SECRET = "ascend-rl-harness-ray-auth"  # Secret with key `token`: Ray's cluster token (see module docstring)
# MindCluster: label, annotation and node selector values per hardware profile (module docstring: the samples).
RING_CONTROLLER = {"ring-controller.atlas": "ascend-910b"}
ACCELERATOR_TYPE = {"a2": "module-910b-8", "a3": "module-a3-16-super-pod"}
SCHEDULE_POLICY = {"a2": "chip8-node8", "a3": "chip2-node16-sp"}
RINGS_CONFIG_MOUNT = "/user/serverid/devindex/config"  # where the samples mount rings-config-<job>
ASCEND_DRIVER = "/usr/local/Ascend/driver"  # the samples' `ascend-driver` hostPath (harness.config.installed)
# The stack's image (docker/npu.Dockerfile: the vllm-ascend image + scripts/install-npu-stack): a versioned tag, not
# :latest, pulled Always; a reference by digest is pulled IfNotPresent (it cannot move).
DEFAULT_IMAGE = "ascend-rl-harness:vllm-ascend-0.23.0"
# CANN's and ATB's environment (vllm-project/vllm-ascend v0.23.0 Dockerfile sources both before building)
NPU_ENV_SCRIPTS = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh")
MIN_RAY_FOR_AUTH = (2, 52)  # RAY_AUTH_MODE=token (Ray 2.52 ray/_private/authentication); older Ray ignores it
# /dev/shm and Ray's object store in it: the 16Gi sizeLimit of MindCluster's training vcjob samples, 3/4 of it for
# the object store (the rest for HCCL / torch shared memory); a larger store would silently fall back to /tmp.
SHM_GIB = 16
OBJECT_STORE_GIB = 12
# CPU per device: MindCluster's 8-NPU pod sample (mindie-ms/server.yaml) requests 16 and limits 64 CPUs.
CPU_PER_DEVICE = {"requests": 2, "limits": 8}
BASE_MEMORY_GIB = 32  # Ray's raylet / GCS, verl's driver and data loaders, the Python processes of the workers
MEMORY_LIMIT_FACTOR = 1.25  # headroom over the modelled need: pinned staging copies during sleep/wake
# RFC 1123 DNS label (Kubernetes namespace names), and an OCI image reference (registry[:port]/path[:tag][@digest]).
# RFC 1123 subdomain (object names such as PVCs) as Kubernetes checks it (apimachinery
# pkg/util/validation/validation.go IsDNS1123Subdomain: dot-separated `[a-z0-9]([-a-z0-9]*[a-z0-9])?` labels, at most
# 253 in all) -- `a..b`, `a-.b` and `-a` are none; a namespace is one label of at most 63 (IsDNS1123Label).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PVC = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Kubernetes' documented limit of one cluster (kubernetes.io/docs/setup/best-practices/cluster-large: at most 5,000
# nodes): a manifest for more is for no cluster (a recipe's 1e8 nodes once printed a 1e8-replica task).
MAX_NODES = 5000
# Secret holding a recipe's secret exports (HF_TOKEN, WANDB_API_KEY, ...), one key per variable: a manifest is
# applied, committed and pasted, so the values never stand in it in clear.
ENV_SECRET = "ascend-rl-harness-env"
_IMAGE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]{1,5})?"
                    r"(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?")


def check_namespace(namespace: str) -> str:
    """A Kubernetes namespace name (RFC 1123 label) or BadInput naming --namespace: it is written into the
    manifest and into the workers' shell command, so nothing else may pass (an unquoted name could inject shell)."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise BadInput(f"--namespace {namespace!r}: not a Kubernetes namespace name (lowercase letters, digits and "
                       "'-', at most 63, starting and ending alphanumeric)")
    return namespace


def check_image(image: str) -> str:
    """An OCI image reference (registry[:port]/name[:tag][@sha256:digest]) or BadInput naming --image."""
    if not isinstance(image, str) or len(image) > 512 or not _IMAGE.fullmatch(image):
        raise BadInput(f"--image {image!r}: not a container image reference (registry/name:tag or name@sha256:...)")
    return image


def check_pvc(pvc: str) -> str:
    """A PersistentVolumeClaim name (RFC 1123 subdomain, at most 253) or BadInput naming --pvc."""
    if not isinstance(pvc, str) or len(pvc) > 253 or not _PVC.fullmatch(pvc):
        raise BadInput(f"--pvc {pvc!r}: not a PersistentVolumeClaim name (RFC 1123 subdomain: dot-separated labels "
                       "of lowercase letters, digits and '-', each starting and ending alphanumeric; at most 253)")
    return pvc


def _name(scale) -> str:
    """The job's name, which also names its Service (`<name>-head`, a DNS label: at most 63) and ConfigMap."""
    name = f"dapo-{scale.name}".lower().replace("_", "-")
    if not _NAMESPACE.fullmatch(f"rings-config-{name}-head"):
        raise BadInput(f"--scale {scale.name!r}: its job name {name!r} is not a Kubernetes name (RFC 1123 label of "
                       "lowercase letters, digits and '-', short enough for `rings-config-<name>-head`)")
    return name


def kubelet_literal(text: str) -> str:
    """`text` as kubelet must pass it on: kubelet expands `$(VAR)` in a container's command, args and env values
    and reduces `$$` to `$` (kubernetes third_party/forked/golang/expansion/expand.go Expand), so every `$` is
    doubled. A recipe value `$(RAY_AUTH_TOKEN)` otherwise became the cluster token inside the command line."""
    return text.replace("$", "$$")


ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")  # a container env var name (IsEnvVarName); also a Secret key


def _env(scale, run_dir: str, env: dict) -> list[dict]:
    from harness.redact import redact_value

    out = []
    for k, v in env.items():
        if not ENV_NAME.fullmatch(str(k)):
            raise BadInput(f"recipe export {k!r}: not an environment variable name Kubernetes accepts")
        if redact_value(str(k), str(v)) != str(v):  # a secret (harness.redact): from the Secret, never in clear
            out.append({"name": k, "valueFrom": {"secretKeyRef": {"name": ENV_SECRET, "key": k}}})
        else:
            out.append({"name": k, "value": kubelet_literal(str(v))})
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


def _secret_overrides(recipe):
    """(the recipe with every secret Hydra override made a reference, their env): `+trainer.wandb_key=V` stood in
    clear in the pod's command (issue 48). It becomes `${oc.env:HARNESS_SECRET_TRAINER_WANDB_KEY}`, which OmegaConf
    resolves from the process environment when verl reads the key, and that variable comes from the Secret
    (`_env` turns a secret name into a secretKeyRef, never a value)."""
    from harness.redact import secret_name

    overrides, env = [], {}
    for override in recipe.overrides:
        key, sep, value = override.partition("=")
        if sep and value and secret_name(key.lstrip("+~")):
            name = "HARNESS_SECRET_" + re.sub(r"\W", "_", key.lstrip("+~")).upper()
            overrides.append(f"{key}=${{oc.env:{name}}}")
            env[name] = value
        else:
            overrides.append(override)
    return dataclasses.replace(recipe, overrides=tuple(overrides)), env


def pull_policy(image: str) -> str:
    """Always only for a moving tag (`:latest` or none: re-resolved on every start instead of whatever a node
    cached); IfNotPresent for a digest or a versioned tag, as Ascend/mindcluster-deploy's training samples do
    (samples/train/basic-training/ranktable/yaml/910b/a800_pytorch_vcjob.yaml: `image: torch:b030`,
    `imagePullPolicy: IfNotPresent`). The default image is a tag built on the nodes (docker/npu.Dockerfile), in no
    registry: with Always every pod stayed in ImagePullBackOff."""
    if "@sha256:" in image:
        return "IfNotPresent"
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_resources(scale, options) -> dict:
    """CPU and memory requests and limits of one pod (one node): CPUs per device as MindCluster's NPU pod sample,
    memory from the plan -- the host side of the offloads (harness.memory.phases.host_offload_bytes per device:
    params, grads and optimizer shards, the rollout weights at sleep level 1), /dev/shm (memory-backed, charged to
    the pod) and a base for Ray and verl's processes; limits MEMORY_LIMIT_FACTOR above. A node too small for the
    plan leaves the pod Pending with the reason, instead of an OOM kill at the first offload. `options`: the job's
    MemoryOptions (harness.memory.job_options.memory_options): the offloads it really sets (issue 44: the request
    was sized for param/grad/optimizer offloads the job never turned on)."""
    from harness.memory.phases import host_offload_bytes

    devices = scale.devices_per_node
    if scale.hardware.kind == "cpu":  # the tiny verl run: ~7 GiB PSS on 2 cores (README)
        return {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}
    need_gib = devices * host_offload_bytes(scale, options) / 2**30 + SHM_GIB + BASE_MEMORY_GIB
    out = {}
    for kind, factor in (("requests", 1.0), ("limits", MEMORY_LIMIT_FACTOR)):
        out[kind] = {"cpu": str(devices * CPU_PER_DEVICE[kind]), "memory": f"{math.ceil(need_gib * factor)}Gi"}
        if scale.hardware.kind == "npu":
            out[kind][NPU_RESOURCE] = str(devices)
    return out


def _prelude(scale) -> list[str]:
    """What every container runs before Ray: the NPU environment, and the Ray version token auth needs."""
    steps = [f"source {script}" for script in NPU_ENV_SCRIPTS] if scale.hardware.kind == "npu" else []
    need = ".".join(map(str, MIN_RAY_FOR_AUTH))
    # packaging (a dependency of Ray itself) parses any PEP 440 version: int() of each part crashed on a local
    # build's "2.60+abc"; the release tuple counts a 2.52 release candidate as 2.52
    check = ('import ray, sys; from packaging.version import Version; '
             f'sys.exit(0 if Version(ray.__version__).release[:2] >= {MIN_RAY_FOR_AUTH!r} else "ray " + '
             f'ray.__version__ + " in this image ignores RAY_AUTH_MODE=token (needs >= {need}): build it with '
             'docker/npu.Dockerfile (ray 2.60.0)")')
    return [*steps, f"python3 -c {shlex.quote(check)}"]


def _container(scale, image: str, role: str, command: str, env: list[dict], resources: dict) -> dict:
    mounts = [{"name": "shared", "mountPath": SHARED_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]
    if scale.hardware.kind == "npu":
        mounts += [{"name": "ascend-driver", "mountPath": ASCEND_DRIVER, "readOnly": True},
                   {"name": "ascend-910-config", "mountPath": RINGS_CONFIG_MOUNT}]
    return {"name": role, "image": image, "imagePullPolicy": pull_policy(image), "workingDir": SHARED_MOUNT,
            "command": ["bash", "-c", kubelet_literal(" && ".join([*_prelude(scale), command]))],
            "env": copy.deepcopy(env),  # no YAML aliases
            "resources": copy.deepcopy(resources),
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumeMounts": mounts,
            "ports": [{"containerPort": RAY_PORT, "name": "gcs"}]}


def _pod(scale, image: str, role: str, command: str, env: list[dict], pvc: str, resources: dict) -> dict:
    labels = {"app": _name(scale), "role": role}
    spec = {"restartPolicy": "Never", "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "automountServiceAccountToken": False,
            "containers": [_container(scale, image, role, command, env, resources)],
            "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": pvc}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}}]}
    if scale.hardware.kind == "npu":
        labels.update(RING_CONTROLLER)
        spec["volumes"] += [{"name": "ascend-driver", "hostPath": {"path": ASCEND_DRIVER}},
                            {"name": "ascend-910-config", "configMap": {"name": rings_config_name(scale)}}]
        selector = {"host-arch": "huawei-arm"}
        if scale.hardware.name in ACCELERATOR_TYPE:
            selector["accelerator-type"] = ACCELERATOR_TYPE[scale.hardware.name]
        spec["nodeSelector"] = selector
    return {"metadata": {"labels": labels}, "spec": spec}


def rings_config_name(scale) -> str:
    """The ConfigMap MindCluster pairs with a ring-controller job: `rings-config-<job name>` (the prefix may not
    change: a800_pytorch_vcjob.yaml)."""
    return f"rings-config-{_name(scale)}"


def manifest(scale, *, image: str = DEFAULT_IMAGE, namespace: str = "default",
             steps: int | None = None, pvc: str = SHARED_CLAIM, job=None, model_path: str | None = None,
             data_dir: str | None = None, forced: str | None = None) -> list[dict]:
    """The manifest documents (on NPU the rings-config ConfigMap, then the Service and the Volcano Job) for a
    scale, as plain dicts. BadInput for a namespace, image or PVC name that is not one, or steps < 1. `pvc`: the
    claim mounted at SHARED_MOUNT in every pod, holding models/<name>, data/dapo and runs/ (the
    default is overridable). `job` (harness.config.job.Job): the user's recipe applied to the scale -- its
    overrides, environment, nodes and devices; PlanError when its plan breaks a rule. `model_path` / `data_dir`:
    --model-path / --data-dir, applied as `plan` applies them (they win over the recipe's own). `forced`: the
    INVALID verdict `launch --force` overrode, recorded on the job."""
    from harness.config.job import build_job
    from harness.launch.jobs import check_steps, job_steps, verl_job
    from harness.memory.job_options import memory_options

    check_namespace(namespace)
    check_image(image)
    check_pvc(pvc)
    steps = check_steps(steps)
    name = _name(scale)
    run_dir = f"{SHARED_MOUNT}/runs/{name}"
    # resume_mode=auto: the job is never rescheduled (maxRetry 0; PodFailed / PodEvicted abort it), but applying
    # this manifest again after an abort (seed 001's resumable launch) continues from the run dir's checkpoints.
    # Inputs by absolute path on the shared mount (harness.launch.jobs.shared_inputs) where neither the flags nor the
    # recipe name them: the job is the one `plan` prints for the same arguments (issue 44: `launch --k8s` rebuilt it
    # without --model-path, then refused the placeholder its own message said the flag replaces).
    user = job.user if job is not None else None
    given = user.override_map() if user else {}
    job = build_job(scale, user,
                    model_path=model_path or (None if given.get("actor_rollout_ref.model.path")
                                              else f"{SHARED_MOUNT}/models/{scale.model.name}"),
                    data_dir=data_dir or (None if given.get("data.train_files") else f"{SHARED_MOUNT}/data/dapo"))
    if job.plan_error:
        from harness.errors import PlanError

        raise PlanError(f"{user.source if user else scale.name}: {job.plan_error}")
    scale, recipe = job.scale, job.recipe
    resources = pod_resources(scale, memory_options(job).options)
    recipe, secret_env = _secret_overrides(recipe)
    job = verl_job(scale, run_dir, steps=job_steps(recipe, steps), resume=True, recipe=recipe)
    # verl_job resolves paths on this machine; on the cluster the run dir is the shared mount's
    env = _env(scale, run_dir, {**dict(job.env), **secret_env})
    head_host = f"{name}-head.{namespace}.svc.cluster.local"
    nodes = scale.nodes
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise BadInput(f"{job.name}: {nodes} nodes; a Kubernetes cluster holds at most {MAX_NODES} "
                       "(kubernetes.io cluster-large): check the recipe's trainer.nnodes")
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
        f"--object-store-memory {OBJECT_STORE_GIB << 30} --disable-usage-stats",
        wait,
        f"{job.entrypoint} 2>&1 | tee {shlex.quote(run_dir)}/job.log",
    ])
    worker_cmd = (f"until ray start --address {shlex.quote(f'{head_host}:{RAY_PORT}')} "
                  f"--object-store-memory {OBJECT_STORE_GIB << 30} --disable-usage-stats --block; do sleep 10; done")
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-head", "namespace": namespace},
               "spec": {"clusterIP": "None", "selector": {"app": name, "role": "head"},
                        "ports": [{"name": "gcs", "port": RAY_PORT}]}}
    tasks = [{"name": "head", "replicas": 1, "template": _pod(scale, image, "head", head_cmd, env, pvc, resources),
              "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}]}]
    if nodes > 1:
        tasks.append({"name": "worker", "replicas": nodes - 1,
                      "template": _pod(scale, image, "worker", worker_cmd, env, pvc, resources)})
    job_labels = {"app": name, "ascend-rl-harness/scale": scale.name}
    job_annotations = {"ascend-rl-harness/forced": forced} if forced else {}
    documents = []
    if scale.hardware.kind == "npu":
        job_labels.update(RING_CONTROLLER)
        if scale.hardware.name in SCHEDULE_POLICY:
            job_annotations["huawei.com/schedule_policy"] = SCHEDULE_POLICY[scale.hardware.name]
        if scale.hardware.name == "a3":
            # one logical SuperPoD block of all the job's dies (MindCluster sp-block, ms_multinodes_acjob_superpod)
            job_annotations["sp-block"] = str(scale.devices)
        documents.append({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": rings_config_name(scale), "namespace": namespace,
                                       "labels": dict(RING_CONTROLLER)},
                          "data": {"hccl.json": '{\n    "status": "initializing"\n}\n'}})
    volcano_job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                   "metadata": {"name": name, "namespace": namespace, "labels": job_labels,
                                **({"annotations": job_annotations} if job_annotations else {})},
                   "spec": {"schedulerName": "volcano", "minAvailable": nodes, "maxRetry": 0,
                            "policies": [{"event": "PodEvicted", "action": "AbortJob"},
                                         {"event": "PodFailed", "action": "AbortJob"}],
                            "tasks": tasks}}
    return [*documents, service, volcano_job]


def manifest_yaml(scale, **kw) -> str:
    """The manifest as multi-document YAML (what `launch --scale NAME --k8s` prints)."""
    import yaml

    return yaml.safe_dump_all(manifest(scale, **kw), sort_keys=False, default_flow_style=False, width=120)
