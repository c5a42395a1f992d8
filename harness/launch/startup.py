"""Where a verl job's time before its first step goes, read from the job's own log (job.log) and its metrics.

verl 0.9.1's V1 trainer starts one Ray actor after another, each importing torch and verl first: the TaskRunner,
the FSDP actor workers, the vLLM server (whose AsyncLLM starts an EngineCore process, and with the `mp` executor
a worker process beside it), then the first weight sync and step 1, during which the agent-loop, reward and
TransferQueue workers start. Each milestone below is a line verl, vLLM or Ray prints with a timestamp; a phase is
the time from the previous milestone to its own. The launcher's part (the Ray cluster's start, before the job
is submitted) comes from launch.json's clock.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput

# (phase, the log line that ends it): in the order verl 0.9.1 prints them (verl/trainer/main_ppo.py,
# verl/trainer/ppo/ray_trainer.py, verl/workers/rollout/vllm_rollout/vllm_async_server.py, vLLM's EngineCore).
MILESTONES: tuple[tuple[str, str], ...] = (
    ("job submitted", r"Runtime env is setting up"),
    ("runtime env + tiny inputs + driver import", r"Connected to Ray cluster"),
    ("TaskRunner start", r"\(TaskRunnerV1 pid=\d+\).*Platform override"),
    ("TaskRunner: config, data", r"create worker group"),
    ("FSDP actor start + init", r"actor and ref model engine initialized"),
    ("vLLM server actor start", r"\(vLLMHttpServer pid=\d+\).*Platform override"),
    ("vLLM engine start (EngineCore, workers, model, KV cache)", r"all initialize finished, ready to fit"),
    ("first weight sync", r"update_weights done"),
)
FIRST_STEP = "step 1 (agent-loop, reward and TransferQueue workers start)"
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})[,.](\d{3})")


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float


def _stamp(line: str) -> float | None:
    match = _STAMP.search(line)
    if not match:
        return None
    when = _dt.datetime.strptime(match.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    return when.replace(tzinfo=_dt.timezone.utc).timestamp() + int(match.group(2)) / 1000


def startup_phases(job_log: str | Path, first_step_s: float | None = None) -> tuple[Phase, ...]:
    """The phases before and of step 1 in a verl job's log; `first_step_s` (verl's timing_s/step of step 1) adds
    the first step itself. BadInput naming the log and the first milestone it lacks."""
    path = Path(job_log)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the job log ({exc.strerror or exc})") from None
    stamps: list[tuple[str, float]] = []
    at = 0
    for name, pattern in MILESTONES:
        regex = re.compile(pattern)
        for i in range(at, len(lines)):
            if regex.search(lines[i]) and (t := _stamp(lines[i])) is not None:
                stamps.append((name, t))
                at = i + 1
                break
        else:
            raise BadInput(f"{path}: no {name!r} milestone (/{pattern}/) after line {at}; is this a verl 0.9.1 job log "
                           "that reached its first step?")
    phases = [Phase(name, round(t - stamps[i - 1][1], 3)) for i, (name, t) in enumerate(stamps) if i]
    if first_step_s is not None:
        phases.append(Phase(FIRST_STEP, round(first_step_s, 3)))
    return tuple(phases)
