"""Real-world verl log shapes for the ingest self-tests, written with verl's and Ray's own printing code.

verl 0.9.1's console logger prints `concat_dict_to_str(data, step)` (verl/utils/logger/aggregate_logger.py:
"step:N - key:pformat(value)", numpy 2 scalars as np.float64(x)); under Ray the TaskRunner's stdout reaches the
driver through `ray._private.worker.print_worker_logs`, which prefixes every line with a coloured
"(TaskRunner pid=N)". The rest is what people do to logs they publish: a job resumed from a checkpoint logs from
step 101 (verl restores global_steps), a terminal or a paste wraps long lines at a fixed width (mid-key), and
authors append notes to a line.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

REWARD, RESPONSE, PG_LOSS = "critic/rewards/mean", "response_length/mean", "actor/pg_loss"
KEYS = (REWARD, RESPONSE, PG_LOSS, "actor/grad_norm", "training/rollout_probs_diff_mean", "timing_s/step",
        "perf/throughput")


def step_metrics(step: int) -> dict:
    """One step as verl's trainer hands it to the logger: numpy 2 scalars from reduce_metrics, python floats."""
    return {REWARD: np.float64(-1.0 + 0.01 * step), RESPONSE: np.float64(100.0 + step),
            PG_LOSS: np.float64(0.001 * step), "actor/grad_norm": np.float64(0.5),
            "training/rollout_probs_diff_mean": np.float64(4.4e-3), "timing_s/step": 12.5,
            "perf/throughput": np.float64(1000.0 + step)}


def console_line(step: int, data: dict | None = None) -> str:
    """verl's console line for one step, exactly as its LocalLogger prints it."""
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    return concat_dict_to_str(step_metrics(step) if data is None else data, step=step)


def through_ray(lines: list[str], pid: int = 2787, actor: str = "TaskRunner") -> list[str]:
    """The lines as the Ray driver prints a worker's stdout: "\\x1b[36m(TaskRunner pid=2787)\\x1b[0m ..."."""
    from ray._private.worker import print_worker_logs

    buf = io.StringIO()
    print_worker_logs({"pid": pid, "actor_name": actor, "ip": "10.0.0.2", "localhost": "10.0.0.2", "lines": lines},
                      buf)
    return buf.getvalue().splitlines()


def wrap(line: str, width: int) -> list[str]:
    """A line cut every `width` characters, as a terminal copy or a pasted log wraps it."""
    return [line[i:i + width] for i in range(0, len(line), width)]


def write_console_log(path: Path, steps, *, wrap_width: int | None = None, note: dict[int, str] | None = None,
                      noise: bool = True) -> Path:
    """A driver log of a verl run: Ray-prefixed, coloured metric lines for `steps`, tqdm/INFO noise between them,
    lines wrapped at `wrap_width`, and `note[step]` appended to that step's line."""
    out = ["2025-06-01 10:00:00,000 INFO worker.py:1888 -- Started a local Ray instance.",
           "(TaskRunner pid=2787) Creating file logger at /tmp/metrics.jsonl"] if noise else []
    for step in steps:
        line = console_line(step) + (note or {}).get(step, "")
        printed = through_ray([line])
        for physical in printed:
            out.extend(wrap(physical, wrap_width) if wrap_width else [physical])
        if noise:
            out.append(f"Training Progress: {step}%|##        | {step}/100 [00:{step:02d}<01:00, 1.2s/it]")
    path.write_text("\n".join(out) + "\n")
    return path
