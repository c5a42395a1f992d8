"""pytest-benchmark: rendering the full report page (five curve plots and the step's phase-time bar, matplotlib,
base64-embedded) and the throughput of a 1000-step run. Both sit on the main job's critical path after the suites
finish."""
from __future__ import annotations

from harness.config.hardware import PROFILES
from harness.metrics.run import Run, Series
from harness.metrics.throughput import throughput
from harness.report.render import render_html


def test_render_full_report_page(benchmark, full_report):
    page = benchmark.pedantic(render_html, args=(full_report,), rounds=3, warmup_rounds=1)
    assert page.count("data:image/png;base64,") == 6


def test_throughput_of_a_long_run(benchmark):
    steps = tuple(range(1, 1001))
    run = Run("long", {"timing_s/step": Series(steps, tuple(800.0 + s % 7 for s in steps)),
                       "perf/total_num_tokens": Series(steps, tuple(1.35e7 for _ in steps)),
                       "timing_s/gen": Series(steps, tuple(500.0 for _ in steps))})
    tp = benchmark(throughput, run, PROFILES["a3"], devices=256)
    assert len(tp.window) == 999 and 120 < tp.tps_per_card < 135
