"""The tiny scale's DAPO job: verl's real `python3 -m verl.trainer.main_ppo` on CPU, launched like every scale.

Its job is harness.launch.jobs.verl_job (the overrides `plan --scale tiny --format verl-cli` prints:
harness.config.recipe + harness.config.cpu_tier, with the user's recipe rehearsed: harness.config.job.rehearsal)
plus `job_options`, whose preparation step runs in front:
`python -m harness.launch.tiny_verl --run-dir D --seed S` writes, inside the run directory and offline,

  inputs/model/  the tiny DeepSeek-V3 (random weights of `seed`, fp32 safetensors) plus the char tokenizer
  inputs/data/   train.parquet / test.parquet in verl's RLHFDataset layout (the tiny task: harness.config.task)
  meta.json      the harness's run metadata (scale, hardware, devices, versions, seed, fault)

and verl writes its FileLogger `metrics.jsonl` beside them. `fault` seeds a rollout fault through the vLLM worker
extension (harness.launch.verl_rollout) for the suites' self-test on the real trainer.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from harness.config import cpu_tier
from harness.errors import BadInput
from harness.metrics.keys import META_FILE

INPUTS = "inputs"
TRAIN_PROMPTS = 256
TEST_PROMPTS = 16
# lm_head at this fraction of random_state_dict's scale: near-uniform first rollouts, so every group has reward
# variance (random_state_dict's peaked heads suit greedy MLA checks, not RL exploration; the lab does the same).
HEAD_SCALE = 0.1
DEFAULT_STEPS = 15  # covers the alignment window (steps 5-14) and the 10-step trend of harness.metrics.baseline
# Bounds of a tiny launch (s). When the weight sync fails, main_ppo hangs instead of exiting: STALL_S stops a job
# that logged no new step for that long (the first step counted from submission). Measured on the 2-core AVX2 EPYC
# beside pytest -n 2 (CI): 262 s of start-up + 113 s to step 1, later steps 22-49 s; a 600 s total bound stopped
# that healthy run at step 8 of 15 (stop 37's CI), and an AVX-512 host runs the same job in 226 s. So the total
# bound is a backstop only, and the stall bound is what ends a hung job: ~1.6x the worst start-to-step-1 seen.
STALL_S = 600.0
TIMEOUT_S = 3600.0


# One tiny verl run at a time on this machine (~7 GiB and both cores each): every `launch --scale tiny --local`
# holds this lock while it runs, so a second one queues instead of starving the first.
MACHINE_LOCK = Path(tempfile.gettempdir()) / "ascend-rl-harness-tiny-verl.lock"


def one_at_a_time():
    """Hold MACHINE_LOCK (waiting for it) for the duration of a tiny verl run; in /tmp, which anyone can write, so
    never through a planted link (harness.io.held)."""
    from harness.io import held

    return held(MACHINE_LOCK)


def model_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / INPUTS / "model"


def data_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / INPUTS / "data"


def prepare_argv(run_dir: str | Path, *, seed: int, steps: int, fault: str | None = None,
                 python: str = "python") -> list[str]:
    """The command that prepares a tiny run directory (`prepare`), as the job runs it."""
    return [python, "-m", __name__, "--run-dir", str(run_dir), "--seed", str(seed), "--steps", str(steps),
            *(["--fault", fault] if fault else [])]


def _prepared_key(seed: int, steps: int, fault: str | None) -> str:
    return f"seed={seed} steps={steps} fault={fault}"


def prepare(run_dir: str | Path, *, seed: int, steps: int, fault: str | None = None) -> Path:
    """Write the tiny model + tokenizer, the parquet data and meta.json into `run_dir`; returns `run_dir`. A run
    directory prepared for the same seed, steps and fault already (`launch --local` prepares it while its Ray
    cluster starts: ~7 s of imports and writes off the job's critical path) is left as it is."""
    stamp = Path(run_dir) / INPUTS / ".prepared"
    if stamp.is_file() and stamp.read_text() == _prepared_key(seed, steps, fault):
        return Path(run_dir)
    import numpy as np
    import pandas as pd

    from harness.config.hardware import package_versions
    from harness.config.host import fingerprint
    from harness.config.models import TINY_TASK
    from harness.config.task import build_tokenizer, make_rows
    from harness.engines.weights import random_state_dict, write_model_dir
    from harness.io import versioned, write_atomic, write_json_atomic
    from harness.metrics.run import RUN_META_SCHEMA, RUN_META_VERSION

    run = Path(run_dir)
    # the zero router bias baselines/tiny/dapo_verl.json was recorded with (scripts/make-tiny-verl-golden)
    weights = random_state_dict(TINY_TASK, seed, zero_router_bias=True)
    weights["lm_head.weight"] = weights["lm_head.weight"] * HEAD_SCALE
    model = write_model_dir(TINY_TASK, weights, model_dir(run))
    tokenizer = build_tokenizer()
    if len(tokenizer) != TINY_TASK.vocab_size:
        raise BadInput(f"tiny tokenizer covers {len(tokenizer)} tokens but {TINY_TASK.name} has {TINY_TASK.vocab_size}")
    tokenizer.save_pretrained(model)
    data = data_dir(run)
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, count in (("train", TRAIN_PROMPTS), ("test", TEST_PROMPTS)):
        pd.DataFrame(make_rows(rng, count, split)).to_parquet(data / f"{split}.parquet")
    meta = {"name": run.name, "scale": "tiny", "hardware": "cpu", "devices": 1, "versions": package_versions(),
            "trainer": "verl.trainer.main_ppo", "seed": seed, "steps": steps, "fault": fault, "model": TINY_TASK.name,
            # the rollout's dtype (baselines pick their precision floors from it: harness.metrics.baseline)
            "precision": cpu_tier.OVERRIDES["actor_rollout_ref.rollout.dtype"],
            "host": fingerprint()}  # the CPU kernels it ran (harness.config.host): exact mode compares by it
    write_json_atomic(run / META_FILE, versioned(RUN_META_SCHEMA, RUN_META_VERSION, meta))
    write_atomic(stamp, _prepared_key(seed, steps, fault))  # last: it means every input above is complete
    return run


def seed_overrides(seed: int) -> tuple[str, ...]:
    """Everything random in the run follows `seed`: data order, rollout sampling, the actor's init seed."""
    return (f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}",
            f"actor_rollout_ref.actor.fsdp_config.seed={seed}", f"actor_rollout_ref.actor.data_loader_seed={seed}")


def job_options(run_dir: str | Path, *, steps: int = DEFAULT_STEPS, seed: int = 0, fault: str | None = None,
                python: str = "python") -> dict:
    """What the tiny scale's job adds to a scale's verl job (keywords of harness.launch.jobs.verl_job, plus the
    `model_path` / `data_dir` its recipe is built on): the run directory's own model and data, the seed everywhere,
    the fault (a rollout fault through the vLLM worker extension's environment, a configured trainer fault as
    overrides, a patched one through the environment of every verl process), the
    host's kernel caps, and the preparation step that writes the inputs before verl starts. Plain data: this module
    knows no launcher, and the launcher knows nothing of it."""
    from harness.config.host import kernel_env

    faults = (*cpu_tier.ROLLOUT_FAULTS, *cpu_tier.TRAINER_FAULTS, *cpu_tier.PATCHED_FAULTS)
    if fault is not None and fault not in faults:
        raise BadInput(f"--fault {fault!r}: the tiny verl run injects {', '.join(faults)}")
    fault_env = {cpu_tier.ROLLOUT_FAULT_ENV: fault} if fault in cpu_tier.ROLLOUT_FAULTS else \
        {cpu_tier.TRAINER_PATCH_ENV: fault} if fault in cpu_tier.PATCHED_FAULTS else {}
    run_dir = Path(run_dir).resolve()
    return {"model_path": str(model_dir(run_dir)), "data_dir": str(data_dir(run_dir)),
            "extra_overrides": (*seed_overrides(seed), *cpu_tier.TRAINER_FAULTS.get(fault, ())),
            # HARNESS_CPU_ISA and the kernel caps reach every process of the job (harness.config.host)
            "env": {**kernel_env(), **fault_env},
            "prelude": (tuple(prepare_argv(run_dir, seed=seed, steps=steps, fault=fault, python=python)),)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=prepare.__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--fault", default=None)
    args = p.parse_args(argv)
    try:
        prepare(args.run_dir, seed=args.seed, steps=args.steps, fault=args.fault)
    except BadInput as exc:
        print(f"python -m {__name__}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
