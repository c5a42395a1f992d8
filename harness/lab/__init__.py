"""Tiny DAPO lab: a real DAPO loop on CPU (transformers DeepSeek-V3 actor, reference MLA rollout engine, verl's
core_algos) that writes verl FileLogger metrics and reproduces the real rollout faults (`FAULTS`).

Run it with `ascend-rl-harness lab --steps 30 --seed 0 --fault none --out DIR` (or `python -m harness.lab ...`) or
`run_lab(LabConfig(...), DIR)`.

The tiny suites assert on verl's real trainer (harness.launch.tiny_verl); the lab stays for fault injection: a
MindSpeed-style wrong softmax scale, a rollout that never receives weights, stale absorbed copies under a dummy
load -- faults verl's own trainer cannot be made to do on CPU (the verl run seeds only stale-absorbed, through its
vLLM worker extension).
"""
from harness.lab.config import FAULTS, PREDATED_FIELDS, LabConfig

__all__ = ["FAULTS", "PREDATED_FIELDS", "LabConfig", "run_lab"]


def __getattr__(name: str):
    # run_lab imports torch, transformers and verl: only when asked for, so the CLI's --help stays fast
    if name == "run_lab":
        from harness.lab.loop import run_lab

        return run_lab
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
