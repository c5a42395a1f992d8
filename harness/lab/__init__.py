"""Tiny DAPO lab: a real DAPO loop on CPU (transformers DeepSeek-V3 actor, reference MLA rollout engine, verl's
core_algos) that writes verl FileLogger metrics and reproduces the real rollout faults (`FAULTS`).

Run it with `python -m harness.lab --steps 30 --seed 0 --fault none --out DIR` or `run_lab(LabConfig(...), DIR)`.
"""
from harness.lab.loop import FAULTS, LabConfig, run_lab

__all__ = ["FAULTS", "LabConfig", "run_lab"]
