"""pytest-benchmark with targets: ingest of a verl FileLogger log of 2,000 steps x 300 metrics
(target <= 1 s) and a compare of the 5 alignment metrics over 2,000 steps against a 5-run baseline
(target <= 0.5 s); the streaming ingest of long, narrow logs (a 2M-line, 373 MiB log once took 179 s and
3.5 GiB read whole) as FileLogger jsonl and as a Ray-prefixed console log, lines/s and MiB/s in extra_info.
The targets are recorded in extra_info; the numbers are in the benchmark report (--benchmark-json)."""
from __future__ import annotations

import json
import math

import pytest

from harness.metrics import curves
from harness.metrics.baseline import ALIGN_METRICS, Baseline
from harness.metrics.ingest import load_run

STEPS, METRICS = 2000, 300


def _keys() -> list[str]:
    return list(ALIGN_METRICS) + [f"extra/metric_{i:03d}" for i in range(METRICS - len(ALIGN_METRICS))]


def _write_log(path, offset: float) -> str:
    keys = _keys()
    # plausible values: inside the sanity limits (a reward in [-2, 1], rollout_probs_diff below bf16's 0.05)
    scale = {k: 0.01 if k == "training/rollout_probs_diff_mean" else 1.0 for k in keys}
    with open(path, "w") as f:
        for step in range(1, STEPS + 1):
            data = {k: scale[k] * (0.5 + 0.4 * math.sin(step * 0.01 + i) + offset) for i, k in enumerate(keys)}
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return [_write_log(root / f"run{i}.jsonl", 0.001 * i) for i in range(6)]


def test_bench_ingest_2000_steps_300_metrics(benchmark, logs):
    benchmark.extra_info["target_s"] = 1.0
    run = benchmark.pedantic(load_run, args=(logs[0],), rounds=3, iterations=1)
    assert len(run.series) == METRICS and len(run[ALIGN_METRICS[0]]) == STEPS


LONG_LINES = 100_000


@pytest.fixture(scope="module")
def long_logs(tmp_path_factory):
    """100k steps x 5 metrics, ~240 bytes a line like the 2M-line log that took 179 s: FileLogger and console."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from verl_logs import console_line, through_ray

    root = tmp_path_factory.mktemp("long")
    keys = list(ALIGN_METRICS)
    jsonl, console = root / "long.jsonl", root / "long.log"
    with jsonl.open("w") as j, console.open("w") as c:
        for step in range(1, LONG_LINES + 1):
            data = {k: math.sin(step * 0.001 + i) for i, k in enumerate(keys)}
            j.write(json.dumps({"step": step, "data": data}) + "\n")
            if step <= 1000:
                prefix = through_ray([console_line(step, data)])[0].split("step:")[0]
            c.write(prefix + console_line(step, data) + "\n")
    return {"filelogger": jsonl, "console": console}


@pytest.mark.parametrize("kind", ["filelogger", "console"])
def test_bench_streaming_ingest_of_a_long_log(benchmark, long_logs, kind):
    path = long_logs[kind]
    run = benchmark.pedantic(load_run, args=(path,), rounds=1, iterations=1)
    mib = path.stat().st_size / 2**20
    benchmark.extra_info.update(lines=LONG_LINES, mib=mib,
                                target="2M lines in bounded memory (tests/test_ingest.py checks the bound)")
    if benchmark.stats:  # None when benchmarks are disabled (under xdist): the ingest still ran once
        seconds = benchmark.stats.stats.mean
        benchmark.extra_info.update(lines_per_s=LONG_LINES / seconds, mib_per_s=mib / seconds)
    assert len(run[ALIGN_METRICS[0]]) == LONG_LINES


def test_bench_compare_2000_steps(benchmark, logs):
    runs = [load_run(p) for p in logs]
    baseline = Baseline.from_runs(runs[1:])
    benchmark.extra_info["target_s"] = 0.5
    alignment = benchmark.pedantic(curves.compare, args=(runs[0], baseline), rounds=5, iterations=1)
    curve_verdicts = [v for v in alignment.verdicts if v.statistic not in ("sanity", "stuck")]
    assert alignment.passed and len(curve_verdicts) == 4 * len(ALIGN_METRICS)  # band, window, trend, spikes
