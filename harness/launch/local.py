"""A throwaway one-node Ray cluster that cannot talk to the network: the CI proof of the launcher.

Ray binds every interface and rewrites 127.0.0.1 to the host's address, so `--dashboard-host
127.0.0.1` alone does not keep its traffic on the machine. `run_isolated` re-executes a command in
new network + PID namespaces (`unshare --net --pid --fork --mount-proc`) where only `lo` is up: there
is no other interface to reach, and every process Ray starts dies with the namespace (its PID 1 is a
shell that also reaps the processes Ray orphans). Inside it,
`local_cluster` starts `ray start --head` on 127.0.0.1 and always ends with `ray stop --force`, which
then only sees this namespace's processes.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from harness.errors import BadInput
from harness.metrics.keys import LAUNCH_FILE

ISOLATED_ENV = "HARNESS_ISOLATED_NETNS"
DASHBOARD_PORT = 8265
LAST_TEMP_DIR: list[str] = []
LAST_ENV: list[dict] = []
_INIT_SCRIPT = 'ip link set lo up && "$@"'  # PID 1 of the namespace: brings lo up, runs argv, reaps orphans
# The user's Ray state must not reach a throwaway cluster (a ~/.ray/auth_token from another cluster made
# `launch --local` fail after 60 s with a 3-line token message). Ray 2.60 turns token auth on for `ray start` when
# RAY_AUTH_MODE is unset and a token exists (ray/_private/authentication/authentication_token_setup.py
# maybe_enable_token_auth_if_token_available; the token comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
# ~/.ray/auth_token), and RAY_ADDRESS redirects clients. The cluster lives in a loopback-only private network
# namespace, so nobody else can reach it: authentication off, explicitly.
USER_RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")
VICTIM_RESOURCE = "victim"
VICTIM_NODE_MANAGER_PORT = 62111


def interfaces() -> list[str]:
    """Network interfaces of this process's network namespace (asked through the kernel, not /sys/class/net,
    which shows the namespace sysfs was mounted in)."""
    import socket

    return sorted(name for _, name in socket.if_nameindex())


def isolated() -> bool:
    """True inside run_isolated's namespaces: the marker is set, `lo` is the only interface, and our parent is
    PID 1 of the new PID namespace (the shell that reaps what Ray orphans, so `ray stop` sees no zombies)."""
    return os.environ.get(ISOLATED_ENV) == "1" and interfaces() == ["lo"] and os.getppid() == 1


def isolated_env(base: dict[str, str]) -> dict[str, str]:
    """`base` without the user's Ray settings (USER_RAY_ENV) and with authentication off."""
    env = {k: v for k, v in base.items() if k not in USER_RAY_ENV}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    return env


_ERROR_LINE = re.compile(r"error|fail|exception|timed? ?out|refused|denied|in use|not found", re.IGNORECASE)


def _last_line(text: str) -> str:
    """The line of a tool's output that says why it failed: its last line that reads like an error, else its last.
    `ray start --head` once failed in a full test session with the dashboard's INFO lines logged after its error."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
    return (errors or lines or ["no output"])[-1]


def isolation_missing() -> str | None:
    """What this host lacks for a loopback-only namespace (a tool, root), or None: a test of a local launch skips on
    that alone, and fails on any other refusal (a refused recipe once read as a missing tool)."""
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return (f"{' and '.join(missing)} not found: install util-linux / iproute2 (apt-get install iproute2) to run "
                "the local Ray cluster in a loopback-only network namespace")
    if os.geteuid() != 0:
        return "the loopback-only Ray cluster needs root for `unshare --net`; run as root or pass --ray-address"
    return None


def run_isolated(argv: list[str], *, timeout_s: float | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `argv` under PID 1 of fresh network and PID namespaces with only loopback up (needs root, util-linux
    `unshare` and iproute2 `ip`). Output passes through; returns the finished process."""
    if os.environ.get(ISOLATED_ENV) == "1":  # never nest: each level would add a PID namespace (max depth 32)
        raise BadInput(f"already inside a harness namespace but it is not loopback-only (interfaces {interfaces()}, "
                       f"pid {os.getpid()}); unset {ISOLATED_ENV}")
    missing = isolation_missing()
    if missing:
        raise BadInput(missing)
    # --kill-child: when unshare dies, however it dies (the launcher SIGKILLed with its process group), the
    # namespace's PID 1 gets SIGKILL, and with it every process of the namespace (Ray's included), instead of
    # living on reparented to the host's PID 1 (util-linux unshare(1), PR_SET_PDEATHSIG on the forked child)
    command = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
               "sh", "-c", _INIT_SCRIPT, "sh", *argv]
    env = {**isolated_env(dict(os.environ if env is None else env)), ISOLATED_ENV: "1"}
    return subprocess.run(command, env=env, timeout=timeout_s, check=False)


# Logical resources of the local head node. verl counts only GPU/NPU resources when it places its workers
# (verl/single_controller/ray/base.py), so the CPU tier's verl run needs one logical GPU; its V1 trainer starts
# more single-CPU actors (TaskRunner, TransferQueue, agent loop, reward, vLLM server) than this machine has cores.
LOCAL_CPUS = 8
LOCAL_GPUS = 1


@contextmanager
def local_cluster(num_cpus: int = LOCAL_CPUS, num_gpus: int = LOCAL_GPUS):
    """`ray start --head` on 127.0.0.1 inside run_isolated's namespaces; yields the dashboard URL (its
    session dir is `LAST_TEMP_DIR[0]`). Always stops the cluster (`ray stop --force`) and removes its temp dir."""
    if not isolated():
        raise BadInput("--local runs Ray only inside a loopback-only network namespace; "
                       "use `ascend-rl-harness launch --local` (it re-executes itself under unshare)")
    ray = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="rh-ray-", dir="/tmp")  # short: Ray's unix socket paths must fit 107 chars
    LAST_TEMP_DIR[:] = [temp]
    env = {**isolated_env(dict(os.environ)),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # fast node-failure detection (GCS health checks every 1 s, dead after 3 misses) so a lost node shows in seconds
    env.update(RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="1000",
               RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3")
    start = [ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
             "--dashboard-port", str(DASHBOARD_PORT), "--include-dashboard", "true", "--num-cpus", str(num_cpus),
             "--num-gpus", str(num_gpus),
             "--temp-dir", temp, "--disable-usage-stats"]
    try:
        for attempt in (1, 2):
            done = subprocess.run(start, env=env, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                break
            # Once, in a full test session on 2 busy cores, the head did not start (its output lost the reason,
            # fixed in _last_line): stop what it started and start it once more before refusing the run.
            subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, check=False)
            _kill_namespace_leftovers()
            if attempt == 2:
                output = f"{done.stdout}\n{done.stderr}"  # Ray's errors go to stderr, its own INFO lines too
                raise BadInput(f"`ray start --head` failed twice ({done.returncode}): {_last_line(output)}")
        url = f"http://127.0.0.1:{DASHBOARD_PORT}"
        _wait_for_job_server(url)
        LAST_ENV[:] = [env]
        yield url
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, check=False)
        _kill_namespace_leftovers()
        shutil.rmtree(temp, ignore_errors=True)


def _kill_namespace_leftovers() -> None:
    """SIGKILL what `ray stop` missed (e.g. the dashboard's multiprocessing forkserver). Safe only here:
    every process of this private PID namespace was started by us; /proc must be this namespace's own
    (PID 1 is run_isolated's shell), and we spare ourselves and PID 1."""
    import signal

    try:
        init = Path("/proc/1/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if not isolated() or init[:3] != [b"sh", b"-c", _INIT_SCRIPT.encode()]:
        return
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) not in (1, os.getpid()):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _wait_for_job_server(url: str, timeout_s: float = 60.0) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            JobSubmissionClient(url).list_jobs()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise BadInput(f"the local Ray job server at {url} did not come up in {timeout_s:.0f} s "
                               f"({type(exc).__name__}: {_last_line(str(exc))})") from None
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------------
# CI proof: `python -m harness.launch.local --out DIR` (run by tests through run_isolated)

FAILING_ENTRYPOINT = "python -c \"import sys; print('seeded failure: the trainer crashed'); sys.exit(3)\""
HANG_TIMEOUT_S = 10.0
STALL_S = 45.0  # the stalling job's bound: its first step comes a Ray job start after submission (beside the hog)
HANGING_ENTRYPOINT = "python -c \"import time; print('seeded hang', flush=True); time.sleep(600)\""
# A job whose gradient norm goes NaN at step 2 and that would then run on: --abort-on-fail must stop it there.
DIVERGING_ENTRYPOINT = ("python -c \"import json, os, time; log = open(os.environ['VERL_FILE_LOGGER_PATH'], 'a'); "
                        "[print(json.dumps({'step': s, 'data': {'actor/grad_norm': g, 'actor/pg_loss': 0.1}}), "
                        "file=log, flush=True) or time.sleep(1.5) for s, g in ((1, 0.7), (2, float('nan')))]; "
                        "print('seeded divergence: still running', flush=True); time.sleep(600)\"")
# A job that logs its first step and then hangs (a weight sync that never returns): the stall bound must stop it
# long before its total timeout.
STALLING_ENTRYPOINT = ("python -c \"import json, os, time; log = open(os.environ['VERL_FILE_LOGGER_PATH'], 'a'); "
                       "print(json.dumps({'step': 1, 'data': {'actor/pg_loss': 0.1}}), file=log, flush=True); "
                       "print('seeded stall after step 1', flush=True); time.sleep(600)\"")


@contextmanager
def cpu_hog(processes: int):
    """`processes` busy-looping interpreters for the duration (killed on exit, whatever happened)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def prove(out_dir: str | Path, *, steps: int = 2, timeout_s: float = 240.0, hog: int = 0) -> dict:
    """Inside run_isolated: start the local cluster (plus a second, victim node), launch the tiny DAPO lab job
    and seeded bad jobs (a crash, a hang, a stall after step 1, a divergence, a job whose node is killed) through
    the launcher, concurrently, beside `hog` busy processes (the verdicts must hold on a loaded machine: at load
    10-13 on 2 cores a crash was once called node-lost); stop the cluster; write and return `proof.json` in
    `out_dir`. The hog starts once the cluster is up: `ray start` waits a fixed 30 s for its raylet (ray 2.60
    _private/node.py), which is Ray's, not a verdict."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    from rich.console import Console

    from harness.io import write_json_atomic
    from harness.launch.jobs import lab_job
    from harness.launch.ray_job import JobSpec, launch
    from harness.metrics.early_stop import stop_rules

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    with local_cluster() as url:
        times["cluster_start_s"] = time.monotonic() - t0
        seen = interfaces()
        add_victim_node()
        times["victim_join_s"] = time.monotonic() - t0 - times["cluster_start_s"]
        victim = JobSpec("victim", HANGING_ENTRYPOINT, str(out / "victim"), 1, working_dir=None,
                         entrypoint_resources={VICTIM_RESOURCE: 1})
        jobs = {"lab": (lab_job(out / "lab", steps=steps), timeout_s),
                "victim": (victim, timeout_s),
                "crash": (JobSpec("crash", FAILING_ENTRYPOINT, str(out / "crash"), 1, working_dir=None), 60.0),
                "hang": (JobSpec("hang", HANGING_ENTRYPOINT, str(out / "hang"), 1, working_dir=None), HANG_TIMEOUT_S),
                "diverged": (JobSpec("diverged", DIVERGING_ENTRYPOINT, str(out / "diverged"), 5, working_dir=None),
                             timeout_s),
                "inspected": (JobSpec("inspected", HANGING_ENTRYPOINT, str(out / "inspected"), 1, working_dir=None),
                              timeout_s),
                "stalled": (JobSpec("stalled", STALLING_ENTRYPOINT, str(out / "stalled"), 3, working_dir=None),
                            timeout_s)}
        stall_s = {"stalled": STALL_S}  # the rest run under their total bound only
        inspection: dict = {}

        def run(name: str) -> dict:
            spec, timeout = jobs[name]
            # only the lab job draws its progress bar; the seeded jobs run beside it quietly
            console = Console(stderr=True, width=120) if name == "lab" else Console(file=io.StringIO())
            t = time.monotonic()
            if name in ("victim", "inspected"):
                helper = ThreadPoolExecutor(1)
                done = helper.submit(lambda: kill_victim_node(url, _job_id(out / "victim")) if name == "victim"
                                     else inspect_job(url, _job_id(out / "inspected"), inspection))
            rules = stop_rules("fp32") if name == "diverged" else ()
            result = launch(url, spec, timeout_s=timeout, stall_s=stall_s.get(name), poll_s=1.0, console=console,
                            node_check_s=2.0, stop_rules=rules)
            if name in ("victim", "inspected"):
                if name == "victim":
                    times["victim_killed"] = done.result()
                else:
                    done.result()
                helper.shutdown()
            times[f"{name}_s"] = time.monotonic() - t
            return {**dataclasses.asdict(result), "ok": result.ok}

        with cpu_hog(hog), ThreadPoolExecutor(len(jobs)) as pool:  # concurrently: the proof stays near a minute
            results = dict(zip(jobs, pool.map(run, jobs), strict=True))
        terminated = terminate_a_launcher(url, out / "terminated")
        t = time.monotonic()
    times["cluster_stop_s"] = time.monotonic() - t
    proof = {"interfaces": seen, "pid": os.getpid(), "hog_processes": hog, "ray_temp_dir": LAST_TEMP_DIR[0],
             "results": results, "inspection": inspection, "terminated": terminated,
             "user_ray_state": {"home_token": (Path.home() / ".ray" / "auth_token").is_file(),
                                "auth_mode": os.environ.get("RAY_AUTH_MODE")},
             "times": times,
             "ray_processes_after_stop": _ray_processes()}
    write_json_atomic(out / "proof.json", proof)
    return proof


# A launcher in its own process (SIGTERM reaches only a main thread) watching a job that never ends, exiting as the
# CLI does (128 + the signal).
TERMINATED_LAUNCHER = """import sys
from harness.errors import exit_code, termination_raises
from harness.launch.local import HANGING_ENTRYPOINT
from harness.launch.ray_job import JobSpec, launch
try:
    with termination_raises():
        launch(sys.argv[1], JobSpec("terminated", HANGING_ENTRYPOINT, sys.argv[2], 1, working_dir=None), poll_s=0.5)
except KeyboardInterrupt as exc:
    sys.exit(exit_code(exc))
"""


def terminate_a_launcher(url: str, run_dir: Path, timeout_s: float = 60.0) -> dict:
    """SIGTERM to a launcher while it watches its job (issue 33: launch.json still said `running` after one): the
    launcher's exit status and what its launch.json says then."""
    import json
    import signal

    env = {**(LAST_ENV[0] if LAST_ENV else os.environ)}
    # this checkout's harness, whatever the environment has installed
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *filter(None, [
        env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, "-c", TERMINATED_LAUNCHER, url, str(run_dir)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path, deadline, seen = run_dir / LAUNCH_FILE, time.monotonic() + timeout_s, None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen = json.loads(path.read_text()).get("verdict")
        except (OSError, ValueError):
            seen = None
        if seen == "running":
            break
        time.sleep(0.2)
    time.sleep(1.0)  # inside its watch loop
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    return {"exit": proc.returncode, "seen_before": seen, "verdict": doc.get("verdict"), "signal": doc.get("signal"),
            "message": doc.get("message"), "stderr": (err or "")[-500:]}


def _job_id(run_dir: Path, timeout_s: float = 60.0) -> str:
    """The job id the launcher wrote into run_dir/launch.json right after submitting."""
    from harness.launch.ray_job import read_launch

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return read_launch(run_dir)["job_id"]
        except (BadInput, KeyError):
            time.sleep(0.2)
    raise BadInput(f"{run_dir / LAUNCH_FILE}: the launcher wrote no job id in {timeout_s:.0f} s")


def inspect_job(url: str, job_id: str, into: dict, timeout_s: float = 240.0) -> None:
    """What `launch --status / --logs / --stop JOB_ID` answer for a job another launcher watches: its status once
    it runs, its log once it printed, then stop it and read its status again (into `into`). The wait is long: on a
    2-core host at load 12 the job was still PENDING after 60 s (it returns as soon as the job runs)."""
    from harness.launch.ray_job import job_logs, job_status, stop_job

    deadline = time.monotonic() + timeout_s
    while job_status(url, job_id)["status"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    while "seeded hang" not in job_logs(url, job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    into["running"] = job_status(url, job_id)
    into["logs"] = job_logs(url, job_id)
    into["stopped"] = stop_job(url, job_id)
    into["after_stop"] = job_status(url, job_id)
    try:
        job_status(url, "no-such-job")
    except BadInput as exc:
        into["unknown_job"] = str(exc)


def add_victim_node() -> None:
    """Join a second node (1 CPU, custom resource `victim`) to the local cluster: the node the lost-node
    proof kills. Only inside local_cluster."""
    ray = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run([ray, "start", "--address", "127.0.0.1:6379", "--node-ip-address", "127.0.0.1",
                           "--num-cpus", "1", "--resources", f'{{"{VICTIM_RESOURCE}": 1}}',
                           "--node-manager-port", str(VICTIM_NODE_MANAGER_PORT), "--disable-usage-stats"],
                          env=LAST_ENV[0], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BadInput(f"could not join the victim node: {_last_line(done.stderr or done.stdout)}")


def kill_victim_node(url: str, job_id: str, timeout_s: float = 60.0) -> str:
    """Once the job runs, SIGKILL the victim node's raylet (found by its node manager port) as a host crash
    would; returns what was killed."""
    import signal

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(url)
    deadline = time.monotonic() + timeout_s
    while client.get_job_status(job_id) != JobStatus.RUNNING:
        if time.monotonic() > deadline or client.get_job_status(job_id).is_terminal():
            return "the victim job never ran"
        time.sleep(0.5)
    time.sleep(2.0)  # let the launcher see the node alive first
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith("raylet") and f"--node_manager_port={VICTIM_NODE_MANAGER_PORT}" in cmd:
            os.kill(int(pid), signal.SIGKILL)
            return f"raylet pid {pid}"
    return "no victim raylet found"


def _ray_processes() -> list[str]:
    """Ray processes still alive in this PID namespace (after `ray stop --force` there must be none)."""
    names = ("raylet", "gcs_server", "dashboard", "ray::", "log_monitor", "runtime_env")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(pid) != os.getpid() and any(n in cmd for n in names):
            found.append(f"{pid} {cmd[:120]}")
    return found


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.launch.local", description=prove.__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--hog", type=int, default=0, help="busy processes beside the jobs (a loaded machine)")
    args = parser.parse_args()
    try:
        prove(args.out, steps=args.steps, hog=args.hog)
    except BadInput as exc:
        print(f"python -m harness.launch.local: error: {exc}", file=sys.stderr)
        sys.exit(2)
