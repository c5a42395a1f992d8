"""Memory verdict speed (target: a full 61-layer plan verdict in <= 10 s on CPU): the analytic plan of
the A2 GBS-128 job, the fake-tensor trace of its rollout prefill at real shapes, and one full MoE layer."""
from __future__ import annotations

from harness.config.models import DEEPSEEK_V3
from harness.config.scales import SCALES
from harness.memory.job_options import scale_options
from harness.memory.phases import plan_memory
from harness.memory.prefill import prefill_verdict
from harness.memory.tracer import trace_decoder_layer


def test_bench_full_plan_verdict(benchmark):
    scale = SCALES["full-a2-gbs128"]
    results = benchmark(plan_memory, scale, scale_options(scale))
    assert len(results) == 5 and all(p.fits for p in results)


def test_bench_traced_prefill_verdict(benchmark):
    scale = SCALES["full-a2-gbs128"]
    verdict = benchmark.pedantic(prefill_verdict, args=(scale, scale_options(scale)), kwargs={"variant": "vanilla"},
                                 rounds=3, iterations=1)
    assert not verdict.fits


def test_bench_moe_layer_trace(benchmark):
    tr = benchmark.pedantic(trace_decoder_layer, args=(DEEPSEEK_V3,),
                            kwargs={"layer": 3, "tokens": 4096, "tp": 8, "ep": 16},
                            rounds=3, iterations=1)
    assert tr.resident_bytes > 2**30
