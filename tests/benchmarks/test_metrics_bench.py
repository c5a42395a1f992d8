"""pytest-benchmark (issue 5 targets): ingest of a verl FileLogger log of 2,000 steps x 300 metrics
(target <= 1 s) and a compare of the 5 alignment metrics over 2,000 steps against a 5-run baseline
(target <= 0.5 s). The targets are recorded in extra_info; the numbers are in the benchmark report."""
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
    with open(path, "w") as f:
        for step in range(1, STEPS + 1):
            data = {k: math.sin(step * 0.01 + i) + offset for i, k in enumerate(keys)}
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


def test_bench_compare_2000_steps(benchmark, logs):
    runs = [load_run(p) for p in logs]
    baseline = Baseline.from_runs(runs[1:])
    benchmark.extra_info["target_s"] = 0.5
    alignment = benchmark.pedantic(curves.compare, args=(runs[0], baseline), rounds=5, iterations=1)
    assert alignment.aligned and len(alignment.verdicts) == 3 * len(ALIGN_METRICS)
