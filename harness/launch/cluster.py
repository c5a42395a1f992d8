"""A multi-node Ray cluster on one CPU host, shaped like the NPU nightly's (issue 29): the nightly's cluster
orchestration rehearsed without its kernels.

    python -m harness.launch.cluster --out DIR      (inside harness.launch.local.run_isolated's namespaces)

Inside run_isolated's namespaces (the "fabric": no interface to the host's network), every node is a process in
network, mount and UTS namespaces of its own. A veth pair wires each one to a bridge (10.77.0.0/24). Each node
also has its own disk: its /tmp is a directory of its own (DIR/disks/<node>/tmp) and /dev/shm a tmpfs of its own.
Only the declared shared directory (DIR/shared) is visible on every node, at the same absolute path, the way a
cluster mounts NFS or OBS. The nodes:
  head    10.77.0.1  `ray start --head` (GCS, dashboard, Jobs API)
  worker  10.77.0.2  `ray start --address head` with the custom resource `rh_worker`: every job's driver runs here
  runner  10.77.0.3  no Ray: the CI runner, as the NPU container gives it. No iproute2 or unshare on its PATH, no
                     capabilities (setpriv drops them all), its working directory on its own disk. It submits and
                     watches the jobs through the harness's own launcher, over the bridge, as the nightly does.

The runner (`run_runner`, its jobs from `runner_jobs`) launches each job twice: with the fix, and with it reverted.
  run root     the lab job (verl's FileLogger) under HARNESS_RUN_ROOT on the shared directory (the fix,
               harness.launch.jobs.shared_run_root), and under the runner's own `runs/`, which is how the run
               directory was resolved before the fix (blocker 6: the job writes on the worker's disk, the runner
               reads 0 steps). The CLI's refusal of a cluster address without a shared run root is checked too.
  ray.init     verl 0.9.1's own `ray.init` under a recipe that exports verl's determinism variables, split as
               harness.launch.jobs.verl_job submits it, and merged into the job's runtime env (point 8: Ray 2.60's
               "Failed to merge the Job's runtime env").
It writes what it saw to DIR/shared/runner.json. The fabric adds what each node's disk holds, and writes
DIR/cluster.json.

With --recipe R --golden G (issue 45: the team's job through the multi-node rehearsal; ci/nightly.sh runs it on a
CPU night with a recipe), the runner launches R's tiny rehearsal instead, as the nightly launches a tier onto a
cluster: `ascend-rl-harness launch --scale tiny --recipe R --ray-address HEAD` with the run directory on the shared
storage, verl's GPU-placed workers on the worker (the node with the logical GPU, LOCAL_GPUS), and judges the run with
`ascend-rl-harness compare RUN G`. Exit 0 when the run succeeded and its curves align with G, 1 when not, 2 when
the fabric cannot be built or the input is bad. From the host, run as root:

    python -m harness.launch.cluster --out DIR --recipe R [--recipe-env NAME=VALUE]... --golden G
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.errors import BadInput
from harness.launch import local

SUBNET = "10.77.0"
BRIDGE, BRIDGE_IP = "rh-fabric", f"{SUBNET}.254"
NODES = {"head": f"{SUBNET}.1", "worker": f"{SUBNET}.2", "runner": f"{SUBNET}.3"}
WORKER_RESOURCE = "rh_worker"
DASHBOARD = f"http://{NODES['head']}:{local.DASHBOARD_PORT}"
PRIVATE_DIRS = ("/tmp",)  # a node's own disk; /dev/shm gets a tmpfs of its own
NODE_CWD, NODE_HOME = "/tmp/work", "/tmp/home"
OBJECT_STORE_BYTES = 200 * 2**20
STEPS = 2
JOB_TIMEOUT_S = 240.0
RUNNER_FILE, PROOF_FILE = "runner.json", "cluster.json"
RECIPE_TIMEOUT_S = 1800.0  # a recipe's tiny verl run on the fabric (its own stall and step limits stop it sooner)
NODE_ENV = "HARNESS_NODE_ENV"  # the environment a node's command runs with (JSON), set by start_node


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BadInput(f"`ip {' '.join(argv)}` failed: {local._last_line(done.stderr)} (the multi-node rehearsal "
                       "needs veth and bridge support in the kernel)")


def _mount(*argv: str) -> None:
    done = subprocess.run(["mount", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BadInput(f"`mount {' '.join(argv)}` failed: {local._last_line(done.stderr)}")


# ---------------------------------------------------------------------------------------------------
# One node: its own network, mount and UTS namespaces (started by `start_node` under unshare)

def become_node(name: str, ip: str, disk: Path, shared: Path) -> None:
    """Inside the node's fresh namespaces, once the fabric has moved `eth0` in: address it, name the host, and give
    the node its own disk, on which `shared` and the node's image (this checkout and its Python environment, as a
    cluster's container image holds them) stay visible at their own paths."""
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{ip}/24", "dev", "eth0")
    _ip("link", "set", "eth0", "up")
    socket.sethostname(name)
    for mount_point in PRIVATE_DIRS:
        own = disk / mount_point.strip("/")
        own.mkdir(parents=True, exist_ok=True)
        # a checkout under /tmp (a CI clone) stays visible too: its .venv/bin/ray was gone on every node
        for kept in _visible(shared):
            if kept.is_relative_to(mount_point):
                inside = own / kept.relative_to(mount_point)
                inside.mkdir(parents=True, exist_ok=True)
                _mount("--bind", str(kept), str(inside))
        _mount("--rbind", str(own), mount_point)
    _mount("-t", "tmpfs", "-o", "size=1g", "tmpfs", "/dev/shm")
    for path in (NODE_CWD, NODE_HOME):
        Path(path).mkdir(parents=True, exist_ok=True)
    os.chdir(NODE_CWD)


def _visible(shared: Path) -> list[Path]:
    """What every node sees at its own path: the shared directory and the image (this checkout, the Python
    environment and its base interpreter), outermost first and none twice."""
    paths = {shared.resolve(), Path(__file__).resolve().parents[2], Path(sys.prefix).resolve(),
             Path(sys.base_prefix).resolve()}
    return sorted(p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths))


def start_node(name: str, argv: list[str], *, disk: Path, shared: Path, env: dict[str, str], log: Path
               ) -> subprocess.Popen:
    """Start node `name` running `argv` (in its namespaces, on its own disk), wired to the fabric's bridge."""
    disk.mkdir(parents=True, exist_ok=True)
    node = subprocess.Popen(
        ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", sys.executable, "-m",
         "harness.launch.cluster", "node", "--name", name, "--disk", str(disk), "--shared", str(shared), "--", *argv],
        # the node's set-up runs with the fabric's tools (ip, mount); `argv` with `env` only
        env={**os.environ, NODE_ENV: json.dumps({**env, "HOME": NODE_HOME})}, stdin=subprocess.PIPE,
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd="/")
    try:
        _wait_for_own_netns(node)  # else the peer lands in the fabric's namespace: unshare(2) may not have run yet
        _ip("link", "add", f"rh-{name}", "type", "veth", "peer", "name", "eth0", "netns", str(node.pid))
        _ip("link", "set", f"rh-{name}", "master", BRIDGE, "up")
        node.stdin.write(b"wired\n")
        node.stdin.close()
    except BaseException:
        node.kill()
        raise
    return node


def _wait_for_own_netns(node: subprocess.Popen, timeout_s: float = 30.0) -> None:
    ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + timeout_s
    while True:
        try:
            if os.readlink(f"/proc/{node.pid}/ns/net") != ours:
                return
        except OSError:
            pass
        if node.poll() is not None or time.monotonic() > deadline:
            raise BadInput(f"unshare of node pid {node.pid} never entered a network namespace of its own "
                           f"(exit {node.poll()})")
        time.sleep(0.05)


def _node_main(args: argparse.Namespace) -> None:
    sys.stdin.readline()  # the fabric has moved eth0 into this network namespace
    become_node(args.name, NODES[args.name], Path(args.disk), Path(args.shared))
    os.execvpe(args.argv[0], args.argv, json.loads(os.environ[NODE_ENV]))


# ---------------------------------------------------------------------------------------------------
# The runner: the NPU container's view (no ip, no unshare, no capabilities), the nightly's launcher

def _effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return -1


# verl 0.9.1's own `ray.init` runtime env (trainer/constants_ppo.py get_ppo_ray_runtime_env), as a job driver: with a
# recipe that exports verl's determinism variables, Ray 2.60 refuses to merge it with the job's runtime env unless
# those travel in the entrypoint's environment (harness.launch.jobs.split_verl_env; the runner launches it both ways).
VERL_INIT_ARGV = ("python", "-c", "import ray; from verl.trainer.constants_ppo import get_ppo_ray_runtime_env; "
                  'ray.init(runtime_env=get_ppo_ray_runtime_env()); print("verl ray.init: merged")')
DETERMINISM_ENV = {"PYTHONHASHSEED": "0", "VLLM_BATCH_INVARIANT": "0", "NCCL_ALGO": "Ring", "HARNESS_X": "1"}


def verl_init_jobs(out: Path) -> dict:
    """Two drivers running verl's ray.init under a recipe that exports DETERMINISM_ENV: `verl_env` as
    harness.launch.jobs.verl_job submits it (the split), `verl_env_merged` with all of it in the job's runtime env
    (the bug: Ray's "Failed to merge the Job's runtime env")."""
    from harness.launch.jobs import split_verl_env, with_env
    from harness.launch.ray_job import JobSpec

    job_env, verl_env = split_verl_env(DETERMINISM_ENV)  # as verl_job splits a recipe's environment
    return {"verl_env": JobSpec("verl_env", shlex.join(with_env(VERL_INIT_ARGV, verl_env)), str(out / "verl_env"), 1,
                                env=job_env, working_dir=None),
            "verl_env_merged": JobSpec("verl_env_merged", shlex.join(VERL_INIT_ARGV), str(out / "verl_env_merged"), 1,
                                       env=DETERMINISM_ENV, working_dir=None)}


def runner_jobs(shared_root: Path, local_root: Path) -> dict:
    """The runner's jobs, each with its driver on the worker: the lab under the shared run root (the fix) and
    under the runner's own `runs/` (the run root before it), and verl's ray.init split and merged."""
    from harness.launch.jobs import lab_job

    jobs = {"shared-root": lab_job(shared_root / "lab", steps=STEPS),
            "runner-local-root": lab_job(local_root / "lab", steps=STEPS),
            **verl_init_jobs(shared_root)}
    return {name: dataclasses.replace(spec, entrypoint_resources={WORKER_RESOURCE: 1}) for name, spec in jobs.items()}


def run_recipe(address: str, recipe: dict, shared_root: Path) -> dict:
    """The team's recipe launched from the runner as the nightly launches a tier onto its cluster (the CLI, the run
    directory on the shared storage), then judged against its golden: each command's exit and JSON verdict."""
    run_dir = shared_root / "recipe-run"
    seen: dict = {"recipe": recipe["recipe"], "golden": recipe["golden"], "run_dir": str(run_dir)}
    seen["launch"], doc = _cli("launch", "--scale", "tiny", "--recipe", recipe["recipe"], "--ray-address", address,
                               "--run-dir", str(run_dir), *(f"--recipe-env={item}" for item in recipe["recipe_env"]))
    (seen["launch"]["driver_ip"],) = _driver_ips(address, [doc.get("job_id")])
    seen["launch"]["message"] = doc.get("message")
    if seen["launch"]["exit"] == 0:
        seen["compare"], doc = _cli("compare", str(run_dir), recipe["golden"])
        seen["compare"]["failed"] = [f"{v.get('metric')} {v.get('statistic')}" for v in doc.get("verdicts", ())
                                     if v.get("passed") is False][:12]
    return seen


def _cli(*argv: str) -> tuple[dict, dict]:
    """`ascend-rl-harness ARGV --json` as the runner runs it: (its exit, verdict and stderr's tail; its JSON)."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", *argv, "--json"], capture_output=True, text=True,
                          timeout=RECIPE_TIMEOUT_S, check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    return ({"exit": done.returncode, "passed": doc.get("passed"), "state": doc.get("state"),
             "stderr": done.stderr.strip()[-1500:]}, doc)


def _driver_ips(address: str, job_ids: list[str | None]) -> list[str | None]:
    """The address of the node each job's driver ran on (None for a job that never got one)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_nodes

    if not any(job_ids):
        return [None] * len(job_ids)
    client = JobSubmissionClient(address)
    ips = {n.node_id: n.node_ip for n in list_nodes(address=address, timeout=30, raise_on_missing_output=False)}
    return [ips.get(client.get_job_info(job_id).driver_node_id) if job_id else None for job_id in job_ids]


def run_runner(address: str, out: Path, recipe: dict | None = None) -> dict:
    """What the runner sees and what its launches end as (written to `out`): its own jobs, or with `recipe`
    (run_recipe) the team's recipe alone."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    from rich.console import Console

    from harness.io import write_json_atomic
    from harness.launch.jobs import RUN_ROOT_ENV, shared_run_root
    from harness.launch.ray_job import launch

    seen = {"hostname": socket.gethostname(), "interfaces": local.interfaces(), "cwd": os.getcwd(),
            "ip": shutil.which("ip"), "unshare": shutil.which("unshare"), "cap_eff": _effective_capabilities()}
    try:
        local.run_isolated(["true"])
        seen["local_cluster"] = "started"
    except BadInput as exc:
        seen["local_cluster"] = str(exc)
    env = {k: v for k, v in os.environ.items() if k != RUN_ROOT_ENV}  # the fix at the door: the CLI refuses it
    refused = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "--scale", "tiny", "--ray-address",
                              address], env=env, capture_output=True, text=True, timeout=120, check=False)
    seen["cli_without_run_root"] = {"exit": refused.returncode, "stderr": refused.stderr.strip()[-600:]}
    if recipe:
        seen["recipe"] = run_recipe(address, recipe, shared_run_root())
        write_json_atomic(out, seen)
        return seen
    jobs = runner_jobs(shared_run_root(), Path("runs").resolve())

    def run(name: str) -> dict:
        result = launch(address, jobs[name], timeout_s=JOB_TIMEOUT_S, poll_s=1.0, node_check_s=2.0,
                        console=Console(file=io.StringIO()))
        return {**dataclasses.asdict(result), "ok": result.ok}

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(run, jobs), strict=True))
    for result, ip in zip(results.values(), _driver_ips(address, [r["job_id"] for r in results.values()]),
                          strict=True):
        result["driver_ip"] = ip
    seen["jobs"] = results
    write_json_atomic(out, seen)
    return seen


def _runner_main(args: argparse.Namespace) -> None:
    run_runner(args.address, Path(args.out), json.loads(args.recipe) if args.recipe else None)


# ---------------------------------------------------------------------------------------------------
# The fabric: the bridge, the three nodes, the evidence

def _ray_env() -> dict[str, str]:
    env = local.isolated_env(dict(os.environ))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="1000",
               RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3")
    return env


def _wait_for_nodes(count: int, timeout_s: float = 90.0) -> None:
    from harness.launch.ray_job import _alive_nodes

    deadline = time.monotonic() + timeout_s
    while len(_alive_nodes(DASHBOARD) or ()) < count:
        if time.monotonic() > deadline:
            raise BadInput(f"the worker node did not join the head at {DASHBOARD} in {timeout_s:.0f} s")
        time.sleep(1.0)


def _stop(node: subprocess.Popen) -> None:
    if node.poll() is None:
        node.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


def _files(root: Path) -> list[str]:
    """The files under `root`, relative, without Ray's own session directory (hundreds of logs and sockets)."""
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0]
                  != "ray")


def _on_shared(recipe: dict, shared: Path) -> dict:
    """The recipe's files as the runner reads them: a file on a node's own disk (PRIVATE_DIRS: a CI job's /tmp)
    is copied to the shared directory, as a night keeps its inputs on the cluster's storage (the golden under the
    fabric's /tmp was "no such file" to the runner's compare)."""
    inputs, seen = shared / "inputs", {}
    for key in ("recipe", "golden"):
        path = Path(recipe[key])
        private = any(path.is_relative_to(d) for d in PRIVATE_DIRS)
        if private and not any(path.is_relative_to(v) for v in _visible(shared)):
            inputs.mkdir(parents=True, exist_ok=True)
            path = Path(shutil.copy2(path, inputs / f"{key}-{path.name}"))
        seen[key] = str(path)
    return {**recipe, **seen}


def prove(out_dir: str | Path, *, timeout_s: float = 420.0, recipe: dict | None = None) -> dict:
    """Inside run_isolated: bring up the fabric and its nodes, let the runner launch its jobs (or `recipe`:
    run_recipe), stop the cluster, and write `cluster.json` in `out_dir` (also when the fabric cannot be built:
    {"unsupported": why})."""
    from harness.io import write_json_atomic

    out = Path(out_dir)
    shared, disks, logs = out / "shared", out / "disks", out / "logs"
    for path in (shared, disks, logs):
        path.mkdir(parents=True, exist_ok=True)
    if not local.isolated():
        raise BadInput("the multi-node rehearsal runs inside run_isolated's namespaces (harness.launch.local)")
    setpriv = shutil.which("setpriv")
    try:
        if setpriv is None:
            raise BadInput("setpriv not found: install util-linux (the runner drops its capabilities with it)")
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
    except BadInput as exc:
        proof = {"unsupported": str(exc)}
        write_json_atomic(out / PROOF_FILE, proof)
        return proof
    if recipe:
        recipe = _on_shared(recipe, shared)
    env, ray = _ray_env(), str(Path(sys.executable).with_name("ray"))
    common = ["--block", "--disable-usage-stats", "--object-store-memory", str(OBJECT_STORE_BYTES)]
    t0 = time.monotonic()
    times: dict[str, float] = {}
    nodes: list[subprocess.Popen] = []
    try:
        nodes.append(start_node("head", [ray, "start", "--head", "--node-ip-address", NODES["head"],
                                         "--dashboard-host", NODES["head"], "--dashboard-port",
                                         str(local.DASHBOARD_PORT), "--include-dashboard", "true", "--num-gpus", "0",
                                         "--num-cpus", "4", *common], disk=disks / "head", shared=shared, env=env,
                                log=logs / "head.log"))
        local._wait_for_job_server(DASHBOARD, timeout_s=120.0)
        times["head_s"] = time.monotonic() - t0
        # a recipe's tiny verl run: verl places its workers by GPU count (harness.launch.local.LOCAL_GPUS), so the
        # worker holds the logical GPU and the local cluster's CPUs, and verl's trainer lands there
        worker = (["--num-gpus", str(local.LOCAL_GPUS), "--num-cpus", str(local.LOCAL_CPUS)] if recipe
                  else ["--num-cpus", "4"])
        nodes.append(start_node("worker", [ray, "start", "--address", f"{NODES['head']}:6379", "--node-ip-address",
                                           NODES["worker"], "--resources", json.dumps({WORKER_RESOURCE: 1}),
                                           *worker, *common], disk=disks / "worker", shared=shared, env=env,
                                log=logs / "worker.log"))
        _wait_for_nodes(2)
        times["worker_s"] = time.monotonic() - t0 - times["head_s"]
        runner_env = {"PATH": str(Path(sys.executable).parent), "HARNESS_RUN_ROOT": str(shared),
                      "RAY_USAGE_STATS_ENABLED": "0", "LANG": "C.UTF-8",
                      # the image's harness is the fabric's own (a checkout on PYTHONPATH, not the one installed)
                      **{k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)}}
        # no capabilities: as an unprivileged container's root (cannot unshare, mount or add links)
        runner = start_node("runner", [setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all",
                                       "--no-new-privs", "--", sys.executable, "-m", "harness.launch.cluster",
                                       "runner", "--address", DASHBOARD, "--out", str(shared / RUNNER_FILE),
                                       *(["--recipe", json.dumps(recipe)] if recipe else [])],
                            disk=disks / "runner", shared=shared, env=runner_env, log=logs / "runner.log")
        nodes.append(runner)
        t = time.monotonic()
        runner_exit = runner.wait(timeout=timeout_s + (RECIPE_TIMEOUT_S if recipe else 0.0))
        times["runner_s"] = time.monotonic() - t
    finally:
        for node in reversed(nodes):
            _stop(node)
    try:
        seen = json.loads((shared / RUNNER_FILE).read_text())
    except (OSError, ValueError):
        tail = (logs / "runner.log").read_text(errors="replace")[-2000:]
        raise BadInput(f"the runner exited {runner_exit} without {shared / RUNNER_FILE}; its log ends:\n{tail}"
                       ) from None
    proof = {"runner": seen, "runner_exit": runner_exit, "nodes": NODES, "shared": str(shared), "times": times,
             "disks": {name: _files(disks / name / "tmp") for name in NODES}, "shared_files": _files(shared)}
    write_json_atomic(out / PROOF_FILE, proof)
    return proof


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.launch.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the fabric: write cluster.json (and the nodes' disks and logs) here")
    parser.add_argument("--recipe", help="launch this recipe's tiny rehearsal from the runner instead of its own jobs")
    parser.add_argument("--recipe-env", action="append", default=[], metavar="NAME=VALUE",
                        help="the environment the recipe's launch script is read with (repeatable)")
    parser.add_argument("--golden", help="with --recipe: the golden its run is judged against (baseline record)")
    sub = parser.add_subparsers(dest="role")
    node = sub.add_parser("node")
    node.add_argument("--name", choices=tuple(NODES), required=True)
    node.add_argument("--disk", required=True)
    node.add_argument("--shared", required=True)
    node.add_argument("argv", nargs=argparse.REMAINDER)
    runner = sub.add_parser("runner")
    runner.add_argument("--address", required=True)
    runner.add_argument("--out", required=True)
    runner.add_argument("--recipe", help="run_recipe's input (JSON)")
    args = parser.parse_args(argv)
    try:
        if args.role == "node":
            args.argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            _node_main(args)
        elif args.role == "runner":
            _runner_main(args)
        elif not args.out:
            parser.error("--out is required")
        else:
            recipe = _recipe_input(args)
            if not local.isolated():  # the fabric is built inside run_isolated's namespaces (root, unshare, ip)
                return local.run_isolated([sys.executable, "-m", "harness.launch.cluster", "--out",
                                           str(Path(args.out).resolve()), *_recipe_argv(recipe)]).returncode
            proof = prove(args.out, recipe=recipe)
            return _verdict(proof) if recipe else 0
    except BadInput as exc:
        print(f"python -m harness.launch.cluster: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _recipe_input(args: argparse.Namespace) -> dict | None:
    """--recipe/--golden as absolute paths (the runner works in a directory of its own disk), checked up front."""
    from harness.config.user_recipe import parse_recipe_env

    if not args.recipe:
        if args.golden or args.recipe_env:
            raise BadInput("--golden and --recipe-env go with --recipe")
        return None
    if not args.golden:
        raise BadInput(f"--recipe {args.recipe}: give --golden, the golden recorded from its own tiny runs")
    for option, path in (("--recipe", args.recipe), ("--golden", args.golden)):
        if not Path(path).is_file():
            raise BadInput(f"{option} {path}: no such file")
    parse_recipe_env(args.recipe_env)  # `launch --recipe-env`'s own check, before the fabric is built
    return {"recipe": str(Path(args.recipe).resolve()), "golden": str(Path(args.golden).resolve()),
            "recipe_env": list(args.recipe_env)}


def _recipe_argv(recipe: dict | None) -> list[str]:
    if not recipe:
        return []
    return ["--recipe", recipe["recipe"], "--golden", recipe["golden"],
            *(f"--recipe-env={item}" for item in recipe["recipe_env"])]


def _verdict(proof: dict) -> int:
    """One line: the recipe's run on the cluster, and its curves against the golden. 0 when both pass."""
    if "unsupported" in proof:
        print(f"python -m harness.launch.cluster: error: the fabric cannot be built here: {proof['unsupported']}",
              file=sys.stderr)
        return 2
    seen = proof["runner"]["recipe"]
    launch, compare = seen.get("launch", {}), seen.get("compare")
    if launch.get("exit") != 0 or compare is None:
        print(f"FAIL multi-node rehearsal: {Path(seen['recipe']).name} did not run on the cluster (launch exit "
              f"{launch.get('exit')}: {launch.get('message') or launch.get('stderr', '')[-300:]})")
        return 1
    if compare.get("exit") not in (0, 1):
        print(f"FAIL multi-node rehearsal: {Path(seen['recipe']).name} ran on the cluster but was not judged "
              f"(compare exit {compare.get('exit')}: {compare.get('stderr', '')[-300:]})")
        return 1
    if compare.get("exit") != 0:
        print(f"FAIL multi-node rehearsal: {Path(seen['recipe']).name} on the cluster does not align with "
              f"{seen['golden']}: {', '.join(compare.get('failed') or [compare.get('stderr', '')[-300:]])}")
        return 1
    print(f"PASS multi-node rehearsal: {Path(seen['recipe']).name} ran on the cluster and aligns with {seen['golden']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
