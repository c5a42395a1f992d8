"""Submit a job (a JobSpec) to an existing Ray cluster through the Ray Jobs API, watch it, collect it.

Which job a scale runs -- verl's own DAPO on every scale, at `tiny` on CPU -- is harness.launch.jobs's; this
launcher runs any JobSpec the same way and knows no scale's job. The harness never schedules work itself: Ray
places the job, verl places its workers.

While the job runs, a rich progress bar shows steps done / total, the ETA and the latest reward and
throughput, read from the FileLogger jsonl through harness.metrics.ingest (the run directory must be on
storage the harness host shares with the cluster: NFS, a PVC, or the local disk of a one-node cluster).
The job ends with one verdict (VERDICTS) recorded in
`launch.json` beside the job's logs (`job.log`), which are kept whatever the verdict.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import BadInput
from harness.io import read_versioned, versioned, write_atomic, write_json_atomic
from harness.launch.address import call_timeout, check_dashboard, dashboard_url, get_bounded, stalled, within
from harness.metrics.keys import JOB_LOG_FILE, LAUNCH_FILE, METRICS_FILE, REWARD, THROUGHPUT
from harness.redact import for_terminal, redact, redact_doc

REPO_ROOT = Path(__file__).resolve().parents[2]


def checkout_dir(root: Path = REPO_ROOT) -> str | None:
    """The harness's checkout, which a job uploads as its Ray working dir; None when the harness runs from an
    installed wheel (`root` is then site-packages, which a job would have uploaded whole): the team's image has
    the harness installed, and the cluster's nodes run it from there."""
    return str(root) if all((root / p).exists() for p in ("pyproject.toml", "harness", "suites")) else None
# Never upload these with the working dir (Ray also honours .gitignore): environments, VCS, outputs.
WORKING_DIR_EXCLUDES = (".venv", ".tox", ".git", "reports", "runs", "models", "data", "**/__pycache__",
                        ".benchmarks", ".hypothesis", "*.egg-info")
# aborted: stopped by the harness at the first verdict the job could no longer pass (harness.metrics.early_stop)
VERDICTS = ("succeeded", "failed", "timeout", "node-lost", "stopped", "aborted")
LAUNCH_SCHEMA = "ascend-rl-harness/launch"  # launch.json (harness.metrics.keys.LAUNCH_FILE)
LAUNCH_VERSION = 1
# A job id as it may reach the Jobs API's URL path (/api/jobs/<id>): the harness's own submission ids
# (harness-<scale>-<date>-<n>) and Ray's (raysubmit_<base62>, ray/dashboard/modules/job/common.py
# generate_job_id) are letters, digits, '_', '-' and '.', starting alphanumeric. Anything else -- `my-job/../victim`
# (which stopped another job), `%2e%2e`, `?`, `#`, a space -- would address a different resource.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_job_id(job_id: str, option: str = "JOB_ID") -> str:
    """`job_id` when it is a job id (_JOB_ID), else BadInput naming `option`: never sent anywhere otherwise."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id) or ".." in job_id:
        raise BadInput(f"{option} {for_terminal(repr(job_id))[:200]}: not a Ray job id (letters, digits, '_', '-', "
                       "'.', starting with a letter or digit, at most 128); pass the id `launch` printed")
    return job_id


@dataclass(frozen=True)
class JobSpec:
    """One job: the shell entrypoint, its environment, where it writes, how many steps it runs (each scale's:
    harness.launch.jobs)."""

    name: str
    entrypoint: str
    run_dir: str  # absolute; the job writes metrics.jsonl (and rollouts/, profiles/, checkpoints/) here
    total_steps: int
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = checkout_dir()  # uploaded by Ray; None when the cluster image has the harness
    resume: bool = False  # a resubmission that resumes from the run's checkpoints (verl resume_mode=auto)
    entrypoint_resources: Mapping[str, float] = field(default_factory=dict)  # custom resources the driver needs
    forced: str | None = None  # the INVALID verdict `launch --force` overrode (recorded in launch.json's spec)
    files_read: tuple[str, ...] = ()  # the files the recipe was read from (a wrapper's target too), named
    reduction: tuple[dict, ...] = ()  # the reduced tier: what bringing the recipe up on one node changed (job.Change)

    @property
    def metrics_path(self) -> Path:
        return Path(self.run_dir) / METRICS_FILE

    def runtime_env(self) -> dict:
        """Ray runtime_env: the plan's env vars (+ the FileLogger path) and the working dir."""
        env = {**self.env, "VERL_FILE_LOGGER_PATH": str(self.metrics_path)}
        runtime = {"env_vars": env}
        if self.working_dir:
            runtime.update(working_dir=self.working_dir, excludes=list(WORKING_DIR_EXCLUDES))
        return runtime


@dataclass(frozen=True)
class Progress:
    """What the metrics file says so far."""

    steps_done: int
    reward: float | None = None
    tps: float | None = None


def read_progress(metrics_path: Path) -> Progress:
    """Latest step, reward and throughput of a (possibly still growing) FileLogger jsonl."""
    from harness.metrics.ingest import load_run

    if not metrics_path.is_file() or metrics_path.stat().st_size == 0:
        return Progress(0)
    try:
        run = load_run(metrics_path, strict=False)  # lenient: the last line may be half written
    except BadInput:
        return Progress(0)
    last = lambda key: run[key].values[-1] if key in run and len(run[key]) else None  # noqa: E731
    return Progress(max(run.steps, default=0), last(REWARD), last(THROUGHPUT))


@dataclass(frozen=True)
class LaunchResult:
    """How a launched job ended. `ok`: it succeeded and logged every step."""

    verdict: str
    job_id: str
    run_dir: str
    message: str
    steps_done: int
    total_steps: int
    elapsed_s: float
    address: str
    stopped_by: dict | None = None  # an abort: the rule, metric, step and values (harness.metrics.early_stop)

    @property
    def ok(self) -> bool:
        return self.verdict == "succeeded" and self.steps_done >= self.total_steps

    def line(self) -> str:
        return (f"{self.verdict.upper()}: job {self.job_id} on {self.address}, {self.steps_done}/{self.total_steps} "
                f"steps in {self.elapsed_s:.0f} s; {self.message}; logs and metrics in {self.run_dir}")


# Ray's message when the entrypoint itself exited non-zero (ray 2.60 dashboard/modules/job/job_supervisor.py):
# "Job entrypoint command failed with exit code N, last available logs (truncated to 20,000 chars):\n<logs>"
ENTRYPOINT_EXIT = re.compile(r"entrypoint command failed with exit code (-?\d+)")


def verdict(status: str, *, steps_done: int, total: int, lost_nodes: tuple[str, ...] = (), timed_out: bool = False,
            stalled_s: float | None = None, job_message: str = "") -> tuple[str, str] | None:
    """The verdict for a job status (a ray JobStatus value) and what the harness saw; None while running.
    `stalled_s`: the job logged no new step for that long (the stall bound), which is a timeout too."""
    if lost_nodes:
        return "node-lost", f"{len(lost_nodes)} node(s) died while the job ran: {', '.join(lost_nodes[:4])}"
    if stalled_s is not None:
        return "timeout", f"no new step in {stalled_s:.0f} s (the stall bound); stopped at step {steps_done} of {total}"
    if timed_out:
        return "timeout", f"no end after the timeout; stopped at step {steps_done} of {total}"
    if status == "SUCCEEDED":
        if steps_done < total:
            return "failed", f"the job exited 0 but logged {steps_done} of {total} steps"
        return "succeeded", f"all {total} steps logged"
    if status == "FAILED":
        lines = job_message.strip().splitlines() or ["job failed"]
        code = ENTRYPOINT_EXIT.search(lines[0])
        last = lines[-1].strip()[:300]
        return "failed", f"exit code {code.group(1)}: {last}" if code else last
    if status == "STOPPED":
        return "stopped", "the job was stopped from outside the harness"
    return None


def _client(address: str):
    """The Jobs API client of the dashboard `address` names (harness.launch.address: one meaning of
    --ray-address), after a bounded reachability check (one line, not minutes of retries)."""
    from ray.job_submission import JobSubmissionClient

    url = dashboard_url(address)
    check_dashboard(url)
    headers = {"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"} if os.environ.get("RAY_AUTH_TOKEN") else None
    try:
        client = within(call_timeout(), stalled(f"--ray-address {redact(url)}"), JobSubmissionClient, url,
                        headers=headers)
    except BadInput:
        raise
    except Exception as exc:  # ConnectionError, RuntimeError from the version check, ...
        raise BadInput(f"--ray-address {redact(url)}: no Ray job server answers there ({type(exc).__name__}); "
                       "start the cluster (`ray start --head --dashboard-host ...`) or pass http://HEAD:8265") from None
    return _Deadlined(client, f"the Ray job server at {redact(url)}", url), url


class _Deadlined:
    """A JobSubmissionClient whose every call has a total deadline (harness.launch.address.within): Ray's client
    sends its requests without a timeout (ray 2.60.0 ray/dashboard/modules/dashboard_sdk.py
    SubmissionClient._do_request: `requests.request(...)` with no `timeout`), so a Jobs API that stalled after the
    version check hung `launch` (even with --timeout) and `launch --status` forever."""

    def __init__(self, client, what: str, url: str):
        self._client, self._what, self._url = client, what, url

    # The reads: Ray's client reads an answer whole (`requests` without `stream`), so a server answering 1 GB for a
    # status was read into memory (issue 48). These GET the same paths Ray's client does (ray 2.60.0
    # ray/dashboard/modules/job/sdk.py JobSubmissionClient.get_job_info / get_job_status / get_job_logs), bounded by
    # harness.launch.address.get_bounded (a cap, a deadline, no redirect).
    def _get(self, path: str, cap: int):
        import json
        import urllib.error

        try:
            body = get_bounded(self._url, path, cap=cap, timeout_s=call_timeout(), what=self._what)
            return json.loads(body)
        except urllib.error.HTTPError as exc:  # as Ray's client raises it: "Job ... does not exist" for a 404
            raise RuntimeError(f"HTTP {exc.code} from {path}") from None
        except ValueError:
            raise RuntimeError(f"{path}: the answer is not JSON") from None

    def get_job_info(self, job_id: str):
        from ray.job_submission import JobDetails

        return JobDetails(**self._get(f"/api/jobs/{check_job_id(job_id)}", MAX_INFO_BYTES))

    def get_job_status(self, job_id: str):
        return self.get_job_info(job_id).status

    def get_job_logs(self, job_id: str) -> str:
        return str(self._get(f"/api/jobs/{check_job_id(job_id)}/logs", MAX_LOG_BYTES).get("logs", ""))

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return lambda *a, **kw: within(call_timeout(), stalled(f"{self._what} ({name})"), attr, *a, **kw)


MAX_INFO_BYTES = 1 << 20  # a job's details: status, message, entrypoint, metadata, runtime env
MAX_LOG_BYTES = 256 << 20  # a job's driver log as the Jobs API returns it (JSON); a verl run logs tens of MB


def _alive_nodes(url: str, attempts: int = 3) -> set[str] | None:
    """Node ids Ray reports alive (state API through the dashboard); None if it does not answer (a busy
    head can miss one call: retried)."""
    from ray.util.state import list_nodes

    for attempt in range(attempts):
        try:
            # no server-side filter: with a dead node in the table it errors (ray 2.60); filter here instead
            nodes = list_nodes(address=url, timeout=30, raise_on_missing_output=False)
            return {n.node_id for n in nodes if n.state == "ALIVE"}
        except Exception:
            time.sleep(1.0 + attempt)
    return None


# Consecutive state-API answers without a node before it counts as dead: on a loaded machine (load average 10-13 on
# 2 cores) one answer can miss a live node, and a crash was then called node-lost. Ray never revives a dead node id.
MISSES_TO_DEAD = 2


@dataclass
class NodeWatch:
    """Which node deaths decide a job's verdict. A node is dead after MISSES_TO_DEAD consecutive answers without it.
    A dead node matters when the job runs there: its driver's node or an actor's, asked of Ray while the job runs
    and again once it failed (a job that crashed on its own has a driver node that is alive). Before the job is
    placed anywhere a death is only suspect: the job may still be placed on the nodes left (the CI proof's victim
    node died while the lab job's runtime env was being set up, and the lab job was called node-lost), so it becomes
    the verdict only when the job ends unplaced (failed or timed out)."""

    nodes_before: frozenset[str]
    job_nodes: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    misses: dict[str, int] = field(default_factory=dict)

    def observe(self, alive: set[str] | None) -> None:
        if alive is None:  # the cluster did not answer; nothing learned
            return
        for node in self.nodes_before:
            self.misses[node] = self.misses.get(node, 0) + 1 if node not in alive else 0
            if self.misses[node] >= MISSES_TO_DEAD:
                self.dead.add(node)

    @property
    def suspects(self) -> set[str]:
        """Nodes missed by the last answer but not yet dead."""
        return {n for n, k in self.misses.items() if k and n not in self.dead}

    def lost(self, *, ended: bool, exited: bool = False) -> tuple[str, ...]:
        """The dead nodes that are the job's verdict. `exited`: Ray says the entrypoint itself exited with a code (the
        job ran somewhere and ended on its own), so a death elsewhere is not its cause even when its nodes are
        unknown (the state API can miss them on a loaded head)."""
        if self.job_nodes:
            return tuple(sorted(self.dead & self.job_nodes))
        return tuple(sorted(self.dead)) if ended and not exited else ()


def _job_nodes(client, url: str, job_id: str) -> set[str]:
    """Nodes the job runs on: its driver's node and the nodes of its actors (verl's workers span them all)."""
    nodes: set[str] = set()
    try:
        info = client.get_job_info(job_id)
    except Exception:
        return nodes
    if info.driver_node_id:
        nodes.add(info.driver_node_id)
    if info.job_id:
        try:
            from ray.util.state import list_actors

            actors = list_actors(address=url, timeout=30, limit=100_000, raise_on_missing_output=False)
            nodes |= {a.node_id for a in actors if a.job_id == info.job_id and a.node_id}
        except Exception:
            pass
    return nodes


def launch(address: str, spec: JobSpec, *, timeout_s: float = 3600.0, stall_s: float | None = None,
           poll_s: float = 2.0, console=None, node_check_s: float = 10.0, stop_rules: tuple = (),
           wait: bool = True) -> LaunchResult:
    """Submit `spec`, show progress until it ends, keep its logs; return the verdict (never raises on a
    failed job -- the verdict says it). BadInput when the cluster cannot be reached. `timeout_s` bounds the whole
    job; `stall_s` (None: no bound) the time without a new logged step, counted from submission for the first:
    a hung job is stopped as soon as it stops making progress, a slow host's healthy one runs to its end. `stop_rules`
    (harness.metrics.early_stop) stop the job at the first verdict it can no longer pass ("aborted"); `wait=False`
    returns once the job is submitted (verdict "submitted": inspect it with `job_status` / `job_logs`)."""
    from ray.job_submission import JobStatus
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    from harness.artifacts.checkpoint import rotate_log_for_resume

    console = console or Console(stderr=True)
    run_dir = Path(spec.run_dir)
    if not spec.resume and spec.metrics_path.exists():
        raise BadInput(f"{spec.metrics_path}: the run directory already holds a run; pass a new --run-dir or --resume")
    client, url = _client(address)
    run_dir.mkdir(parents=True, exist_ok=True)
    if spec.resume:
        rotate_log_for_resume(spec.metrics_path)  # verl's FileLogger truncates it on resume
    nodes_before = _alive_nodes(url) or set()
    job_id = client.submit_job(entrypoint=spec.entrypoint, runtime_env=spec.runtime_env(),
                               entrypoint_resources=dict(spec.entrypoint_resources) or None,
                               submission_id=f"harness-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                             f"{time.time_ns() % 10**6}",
                               metadata={"harness.scale": spec.name, "harness.run_dir": str(run_dir)})
    shown = redact(url)  # launch.json and the verdict line are shared: no token from the address
    rules = [r.name for r in stop_rules]  # what could have stopped it: recorded whatever the verdict
    _write_launch(run_dir, {"job_id": job_id, "address": shown, "verdict": "running", "stop_rules": rules,
                            "nodes_at_submit": len(nodes_before), "spec": dataclasses.asdict(spec)})
    # the id on its own line: what `launch --status/--logs/--stop JOB_ID` (and Ray's `ray job ...`) take
    console.print(f"job {job_id} submitted to {shown}; inspect it with `ascend-rl-harness launch --status|--logs|"
                  f"--stop {job_id} --ray-address {shown}`", soft_wrap=True)
    if not wait:
        return LaunchResult("submitted", job_id, str(run_dir), "not waited for (--no-wait)", 0, spec.total_steps,
                            0.0, shown)
    start = time.monotonic()
    stopped_by, signame = None, None
    last_node_check = start
    watch = NodeWatch(frozenset(nodes_before))
    result = None
    progress = Progress(0)
    last_step, last_step_at = 0, start
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[latest]}"))
    try:
        with Bar(*columns, console=console, transient=False) as bar:
            task = bar.add_task(spec.name, total=spec.total_steps, latest="waiting for step 1")
            while result is None:
                time.sleep(poll_s)
                status = client.get_job_status(job_id)
                progress = read_progress(spec.metrics_path)
                latest = " ".join(f"{k} {v:.4g}" for k, v in (("reward", progress.reward), ("TPS", progress.tps))
                                  if v is not None) or str(status.value if hasattr(status, "value") else status).lower()
                bar.update(task, completed=min(progress.steps_done, spec.total_steps), latest=latest)
                now = time.monotonic()
                if progress.steps_done > last_step:
                    last_step, last_step_at = progress.steps_done, now
                due = now - last_node_check >= node_check_s and status in (JobStatus.RUNNING, JobStatus.PENDING)
                # a failed job is checked too: when its node died, that -- not "failed" -- is the verdict
                if nodes_before and (due or status == JobStatus.FAILED):
                    last_node_check = now
                    if status in (JobStatus.RUNNING, JobStatus.FAILED):  # a failed job's nodes: its own end
                        watch.job_nodes |= _job_nodes(client, url, job_id)
                    watch.observe(_alive_nodes(url))
                    for _ in range(MISSES_TO_DEAD - 1):  # a failed job's node that was just missed: dead or not
                        if status != JobStatus.FAILED or not watch.suspects & (watch.job_nodes or nodes_before):
                            break
                        time.sleep(1.0)
                        watch.observe(_alive_nodes(url))
                no_progress = stall_s is not None and now - last_step_at > stall_s and not status.is_terminal()
                timed_out = no_progress or (now - start > timeout_s and not status.is_terminal())
                # the job's message reaches the verdict line and launch.json: redacted, without terminal escapes
                message = for_terminal(client.get_job_info(job_id).message or "") if status == JobStatus.FAILED else ""
                lost = watch.lost(ended=timed_out or status == JobStatus.FAILED,
                                  exited=bool(ENTRYPOINT_EXIT.search(message)))
                decided = verdict(str(status.value if hasattr(status, "value") else status),
                                  steps_done=progress.steps_done, total=spec.total_steps, lost_nodes=lost,
                                  timed_out=timed_out, stalled_s=stall_s if no_progress else None,
                                  job_message=message)
                if decided is None and stop_rules and status == JobStatus.RUNNING:
                    stop = early_stop(spec.metrics_path, stop_rules)
                    if stop is not None:
                        decided = ("aborted", f"{stop.message()}; the job's outputs are kept")
                        stopped_by = stop.to_json()
                if decided is not None:
                    if not status.is_terminal():
                        client.stop_job(job_id)
                    result = LaunchResult(decided[0], job_id, str(run_dir), decided[1], progress.steps_done,
                                          spec.total_steps, time.monotonic() - start, shown, stopped_by)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the job is stopped and recorded, the command exits 130/143
        # the record first: launch.json said `running` after a SIGTERM whenever stopping the job raised (issue 33)
        signame = signal_name(exc)
        result = LaunchResult("stopped", job_id, str(run_dir), f"the launcher got {signame}; the job was stopped",
                              progress.steps_done, spec.total_steps, time.monotonic() - start, shown)
        try:
            client.stop_job(job_id)
        except Exception as stop:  # noqa: BLE001 -- recorded: the job may still run on the cluster
            result = dataclasses.replace(result, message=f"the launcher got {signame}; stopping job {job_id} failed "
                                         f"({type(stop).__name__}: {str(stop)[:200]}): it may still run")
        raise
    finally:
        if result is not None:  # before the logs: a second signal while they are copied must not lose the verdict
            _write_launch(run_dir, {**dataclasses.asdict(result), "nodes_at_submit": len(nodes_before),
                                    "stop_rules": rules, "spec": dataclasses.asdict(spec),
                                    **({"signal": signame} if signame else {})})
        _keep_logs(client, job_id, run_dir)
    return result


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """SIGINT for Ctrl-C, else the signal harness.errors.Terminated carries (SIGTERM, SIGHUP): what launch.json
    records beside its `stopped` verdict."""
    import signal

    try:
        return signal.Signals(getattr(interrupt, "signum", signal.SIGINT)).name
    except ValueError:
        return f"signal {getattr(interrupt, 'signum', '?')}"


def _write_launch(run_dir: Path, doc: dict) -> None:
    # the spec's entrypoint and environment are shared with the run directory: no secret in them reaches it
    write_json_atomic(run_dir / LAUNCH_FILE, versioned(LAUNCH_SCHEMA, LAUNCH_VERSION, redact_doc(doc)))


def read_launch(run_dir: str | Path) -> dict:
    """The launcher's launch.json of a run directory (job id, address, verdict, spec)."""
    return read_versioned(Path(run_dir) / LAUNCH_FILE, schema=LAUNCH_SCHEMA, version=LAUNCH_VERSION,
                          what="launch record", hint="launch the job again with this harness version",
                          missing="no launch record; was the job launched with `ascend-rl-harness launch`?")


def _keep_logs(client, job_id: str, run_dir: Path) -> None:
    try:
        logs = client.get_job_logs(job_id)
    except Exception as exc:  # the head itself died: say so in the log file instead of losing the verdict
        logs = f"[harness] could not fetch the job logs: {type(exc).__name__}: {exc}\n"
    write_atomic(run_dir / JOB_LOG_FILE, logs)


# ---------------------------------------------------------------------------------------------------
# Stop paying for a run that has failed (`launch --abort-on-fail`, the nightly's launched_run by default)

def stop_rules_for(job) -> tuple:
    """The early-stop rules of a harness.config.job.Job: its rollout precision (verl's rollout dtype, default
    bfloat16), its sampling (top-k / top-p: no mismatch rule) and its scale's tokens/s-per-card target
    (harness.metrics.early_stop.stop_rules)."""
    from harness.metrics.baseline import precision_name
    from harness.metrics.early_stop import stop_rules, truncated_sampling

    values = job.recipe.override_map()
    scale = job.scale
    return stop_rules(precision_name(values.get("actor_rollout_ref.rollout.dtype", "bfloat16")),
                      tps_target=scale.targets.tps_per_card, devices_per_card=scale.hardware.dies_per_card,
                      truncated=truncated_sampling(values))


def early_stop(metrics_path: Path, rules: tuple):
    """The first stop rule the metrics logged so far break (harness.metrics.early_stop.first_stop), or None; a
    file still being written is read leniently (its last line may be half written)."""
    from harness.metrics.early_stop import first_stop
    from harness.metrics.ingest import load_run

    if not metrics_path.is_file() or metrics_path.stat().st_size == 0:
        return None
    try:
        return first_stop(load_run(metrics_path, strict=False), rules)
    except BadInput:
        return None


# ---------------------------------------------------------------------------------------------------
# A submitted job, by id: what `launch --status / --logs / --stop JOB_ID` answer (Ray's JobSubmissionClient)

def _known_job(client, url: str, job_id: str):
    try:
        return client.get_job_info(job_id)
    except Exception as exc:  # RuntimeError "Job ... does not exist" (404), connection errors
        if isinstance(exc, BadInput):  # the deadline: the server stopped answering
            raise
        first = for_terminal(str(exc)).splitlines()[0] if str(exc).strip() else ""
        raise BadInput(f"job {job_id}: not known to the Ray job server at {redact(url)} "
                       f"({type(exc).__name__}: {first})") from None


def job_status(address: str, job_id: str) -> dict:
    """The job's status, message, entrypoint, run directory and (when that directory is readable here) the steps it
    logged; `launch.json`'s verdict when the launcher that watched it recorded one."""
    check_job_id(job_id, "--status")
    client, url = _client(address)
    info = _known_job(client, url, job_id)
    status = str(getattr(info.status, "value", info.status))
    run_dir = (info.metadata or {}).get("harness.run_dir")
    # the job's own text (message, entrypoint, run dir) is printed and may go to a CI log: no secret, no escapes
    doc = {"job_id": job_id, "address": redact(url), "status": for_terminal(status),
           "message": for_terminal(info.message or ""), "entrypoint": for_terminal(info.entrypoint or ""),
           "run_dir": run_dir, "steps_done": None, "verdict": None}
    if run_dir and Path(run_dir).is_dir():
        doc["steps_done"] = read_progress(Path(run_dir) / METRICS_FILE).steps_done
        try:
            doc["verdict"] = read_launch(run_dir).get("verdict")
        except BadInput:
            pass
    if run_dir is not None:
        doc["run_dir"] = for_terminal(str(run_dir))
    return doc


def job_logs(address: str, job_id: str) -> str:
    """The job's driver log as it may be printed: redacted (a token in the entrypoint or the log) and without
    terminal escape sequences."""
    check_job_id(job_id, "--logs")
    client, url = _client(address)
    _known_job(client, url, job_id)
    return for_terminal(client.get_job_logs(job_id))


def stop_job(address: str, job_id: str) -> str:
    """Stop the job; returns its status afterwards (a job that already ended is left as it is)."""
    from ray.job_submission import JobStatus

    check_job_id(job_id, "--stop")
    client, url = _client(address)
    info = _known_job(client, url, job_id)
    if not JobStatus(info.status).is_terminal():
        client.stop_job(job_id)
        deadline = time.monotonic() + 30.0
        while not client.get_job_status(job_id).is_terminal() and time.monotonic() < deadline:
            time.sleep(0.5)
    return str(getattr(client.get_job_status(job_id), "value", client.get_job_status(job_id)))
