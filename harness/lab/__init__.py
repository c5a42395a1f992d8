"""Tiny DAPO lab: a real DAPO loop on CPU (transformers DeepSeek-V3 actor, reference MLA rollout engine, verl's
core_algos) that writes verl FileLogger metrics and reproduces the real rollout faults (`FAULTS`).

Run it with `python -m harness.lab --steps 30 --seed 0 --fault none --out DIR` or `run_lab(LabConfig(...), DIR)`.

The tiny suites assert on verl's real trainer (harness.launch.tiny_verl); the lab stays for fault injection: a
MindSpeed-style wrong softmax scale, a rollout that never receives weights, stale absorbed copies under a dummy
load -- faults verl's own trainer cannot be made to do on CPU (the verl run seeds only stale-absorbed, through its
vLLM worker extension).
"""
from harness.lab.loop import FAULTS, LabConfig, run_lab

__all__ = ["FAULTS", "LabConfig", "run_lab"]
