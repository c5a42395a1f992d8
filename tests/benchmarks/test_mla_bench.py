"""MLA engine speed on CPU: the reference engine's rollout (the tiny DAPO lab rolls out with it every step) and
the freshness check over every layer after a weight sync. No target is set; the numbers go in the report."""
from __future__ import annotations

import torch

from harness.config.models import TINY
from harness.engines.reference import ReferenceEngine
from harness.engines.weights import random_state_dict
from harness.mla.checks import check_freshness

PROMPTS = [[3, 17, 42, 99, 5, 64, 128], [200, 7, 31], [11, 11, 250, 76, 9], [1, 2]]


def test_bench_reference_rollout(benchmark):
    engine = ReferenceEngine(TINY, random_state_dict(TINY, seed=0))
    engine.generate(PROMPTS, 2)  # first-call warm-up of torch kernels
    rollout = benchmark.pedantic(engine.sample, args=(PROMPTS, 16), kwargs={"temperature": 1.0, "seed": 0},
                                 rounds=3, iterations=1)
    benchmark.extra_info["tokens_per_round"] = len(PROMPTS) * 16
    assert all(len(t) == 16 for t in rollout.token_ids)


def test_bench_freshness_check(benchmark):
    engine = ReferenceEngine(TINY, random_state_dict(TINY, seed=0))
    engine.load_weights(random_state_dict(TINY, seed=1).items())
    report = benchmark.pedantic(check_freshness, args=(engine.name, engine.mla_layers(), TINY, torch.float32),
                                rounds=5, iterations=1)
    assert report.ok
