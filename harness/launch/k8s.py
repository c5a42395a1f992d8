"""A Kubernetes manifest for a scale's DAPO job on a bare-metal Ascend cluster (seed 001: node IPs are
not known in advance, so the Ray head is found through a headless Service's DNS name).

Documents: a headless Service for the Ray head, and a Volcano Job (gang-scheduled: all `nodes` pods
start together or none does -- a 32-node job must never hold 31 nodes waiting for the last) with a
`head` task (1 pod: Ray head, waits for every worker to join, then runs verl's command) and a
`worker` task (nodes - 1 pods: Ray workers). Each pod requests the node's NPUs as the Ascend device
plugin's `huawei.com/Ascend910` resource, runs on the host network (HCCL over RoCE) and mounts the
shared volume that holds models/, data/ and runs/ -- the run directory the launcher collects.
"""
from __future__ import annotations

import copy
import shlex

NPU_RESOURCE = "huawei.com/Ascend910"  # Ascend device plugin (MindCluster): one unit per device (die on A3)
RAY_PORT = 6379
DASHBOARD_PORT = 8265
SHARED_MOUNT = "/mnt/shared"
SHARED_CLAIM = "ascend-rl-harness-shared"


def _name(scale) -> str:
    return f"dapo-{scale.name}".lower().replace("_", "-")


def _env(scale, run_dir: str, env: dict) -> list[dict]:
    out = [{"name": k, "value": str(v)} for k, v in env.items()]
    out += [{"name": "VERL_FILE_LOGGER_PATH", "value": f"{run_dir}/metrics.jsonl"},
            {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
            # HCCL binds to the pod's host IP on the host network; known only at run time
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    return out


def _container(scale, image: str, role: str, command: str, env: list[dict]) -> dict:
    container = {"name": role, "image": image, "imagePullPolicy": "IfNotPresent", "workingDir": SHARED_MOUNT,
                 "command": ["bash", "-c", command], "env": copy.deepcopy(env),  # no YAML aliases
                 "volumeMounts": [{"name": "shared", "mountPath": SHARED_MOUNT},
                                  {"name": "dshm", "mountPath": "/dev/shm"}],
                 "ports": [{"containerPort": RAY_PORT, "name": "gcs"},
                           {"containerPort": DASHBOARD_PORT, "name": "dashboard"}]}
    if scale.hardware.kind == "npu":
        count = str(scale.devices_per_node)
        container["resources"] = {"requests": {NPU_RESOURCE: count}, "limits": {NPU_RESOURCE: count}}
    return container


def _pod(scale, image: str, role: str, command: str, env: list[dict]) -> dict:
    return {"metadata": {"labels": {"app": _name(scale), "role": role}},
            "spec": {"restartPolicy": "Never", "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                     "containers": [_container(scale, image, role, command, env)],
                     "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": SHARED_CLAIM}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}


def manifest(scale, *, image: str = "verl-ascend:latest", namespace: str = "default",
             steps: int | None = None) -> list[dict]:
    """The manifest documents (Service, Volcano Job) for a scale, as plain dicts."""
    from harness.launch.ray_job import verl_job

    name = _name(scale)
    run_dir = f"{SHARED_MOUNT}/runs/{name}"
    # resume_mode=auto: a rescheduled head (seed 001's resumable K8s launch) continues from the checkpoints
    job = verl_job(scale, run_dir, steps=steps or 20, resume=True)
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
        f"ray start --head --port {RAY_PORT} --dashboard-host 0.0.0.0 --dashboard-port {DASHBOARD_PORT} "
        "--disable-usage-stats",
        wait,
        f"{job.entrypoint} 2>&1 | tee {shlex.quote(run_dir)}/job.log",
    ])
    worker_cmd = (f"until ray start --address {head_host}:{RAY_PORT} --disable-usage-stats --block; "
                  "do sleep 10; done")
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-head", "namespace": namespace},
               "spec": {"clusterIP": "None", "selector": {"app": name, "role": "head"},
                        "ports": [{"name": "gcs", "port": RAY_PORT}, {"name": "dashboard", "port": DASHBOARD_PORT}]}}
    tasks = [{"name": "head", "replicas": 1, "template": _pod(scale, image, "head", head_cmd, env),
              "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}]}]
    if nodes > 1:
        tasks.append({"name": "worker", "replicas": nodes - 1,
                      "template": _pod(scale, image, "worker", worker_cmd, env)})
    volcano_job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                   "metadata": {"name": name, "namespace": namespace,
                                "labels": {"app": name, "ascend-rl-harness/scale": scale.name}},
                   "spec": {"schedulerName": "volcano", "minAvailable": nodes, "maxRetry": 0,
                            "policies": [{"event": "PodEvicted", "action": "AbortJob"},
                                         {"event": "PodFailed", "action": "AbortJob"}],
                            "tasks": tasks}}
    return [service, volcano_job]


def manifest_yaml(scale, **kw) -> str:
    """The manifest as multi-document YAML (what `launch --scale NAME --k8s` prints)."""
    import yaml

    return yaml.safe_dump_all(manifest(scale, **kw), sort_keys=False, default_flow_style=False, width=120)
