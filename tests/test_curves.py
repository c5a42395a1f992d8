"""Self-tests of harness.metrics.curves and harness.metrics.baseline: each statistic fails on the shape it exists for
(seed 001's -0.8 vs -0.6, a windowed offset, spikes, NaN, a run that stops early) and passes on a run drawn
like the references; baselines round-trip, refuse overwrite and unknown schema versions; the CLI exits 0/1/2."""
from __future__ import annotations

import json
import math
import random

import pytest

from harness.cli import main as cli_main
from harness.errors import BadInput
from harness.metrics import curves
from harness.metrics.baseline import SCHEMA_VERSION, Baseline, load_baseline
from harness.metrics.run import Run, RunMeta, Series

REWARD = "critic/rewards/mean"


def make_run(name, fn, steps=30, noise=0.02, seed=0, metric=REWARD) -> Run:
    rng = random.Random(seed)
    s = tuple(range(1, steps + 1))
    return Run(name, {metric: Series(s, tuple(fn(x) + rng.gauss(0, noise) for x in s))},
               RunMeta(scale="tiny", hardware="cpu", versions={"verl": "0.9.1"}, sources=(f"{name}.jsonl",)))


def gpu_like(step):  # seed 001: the GPU baseline reached -0.6 after 10 steps, then kept rising
    return -0.9 + 0.03 * min(step, 10) + 0.005 * max(step - 10, 0)


def npu_after_two_fixes(step):  # seed 001: the 671B on NPU reached only -0.8 after 10 steps
    return -0.9 + 0.01 * min(step, 10) + 0.005 * max(step - 10, 0)


@pytest.fixture
def gpu_baseline():
    return Baseline.from_runs([make_run(f"gpu{i}", gpu_like, seed=i) for i in range(5)], (REWARD,))


def test_seed001_shape_fails_and_says_where(gpu_baseline):
    alignment = curves.compare(make_run("npu", npu_after_two_fixes, seed=99), gpu_baseline)
    assert not alignment.aligned
    failed = {v.statistic: v for v in alignment.failures}
    assert {"band", "window-mean", "trend"} <= set(failed), alignment.summary()
    trend = failed["trend"]
    assert trend.value == pytest.approx(0.01, abs=0.006) and trend.reference == pytest.approx(0.03, abs=0.006)
    assert "steps 1-10" in trend.message() and "slope" in trend.detail
    assert failed["window-mean"].where == "steps 5-14"


def test_a_run_drawn_like_the_references_passes(gpu_baseline):
    for seed in range(100, 110):
        alignment = curves.compare(make_run("gpu-new", gpu_like, seed=seed), gpu_baseline)
        assert alignment.aligned, alignment.summary() + "; ".join(v.message() for v in alignment.failures)


def test_single_baseline_run_uses_verl_nightly_window_tolerance():
    ref = Baseline.from_runs([make_run("ref", gpu_like, noise=0.0)], (REWARD,))
    near = curves.compare(make_run("near", lambda s: gpu_like(s) + 0.03, noise=0.0), ref)
    far = curves.compare(make_run("far", lambda s: gpu_like(s) + 0.07, noise=0.0), ref)
    assert near.aligned, near.summary()
    (window,) = [v for v in far.failures if v.statistic == "window-mean"]
    assert window.tolerance == pytest.approx(0.05) and abs(window.value - window.reference) == pytest.approx(0.07)


def test_band_allows_a_few_outliers_not_more(gpu_baseline):
    def spiky(steps):
        return lambda s: gpu_like(s) + (0.5 if s in steps else 0.0)

    assert curves.compare(make_run("one-spike", spiky({20}), seed=7), gpu_baseline).aligned
    bad = curves.compare(make_run("spikes", spiky({16, 19, 22, 25}), seed=7), gpu_baseline)
    (band,) = [v for v in bad.failures if v.statistic == "band"]
    assert band.detail.startswith("4 of 30 steps outside the band (allowed 3)")


def test_nan_always_fails_the_band(gpu_baseline):
    run = make_run("nan", lambda s: math.nan if s == 12 else gpu_like(s), seed=3)
    (band,) = [v for v in curves.compare(run, gpu_baseline).failures if v.statistic == "band"]
    assert "non-finite at steps [12]" in band.detail


def test_run_that_stops_early_fails_unless_partial_allowed(gpu_baseline):
    short = make_run("short", gpu_like, steps=8, seed=5)
    strict = curves.compare(short, gpu_baseline)
    assert not strict.aligned and {v.statistic for v in strict.failures} == {"window-mean", "trend"}
    partial = curves.compare(short, gpu_baseline, allow_partial=True)
    assert partial.aligned and {v.statistic for v in partial.verdicts if v.passed is None} == {"window-mean", "trend"}


def test_missing_metric_fails_coverage(gpu_baseline):
    run = make_run("other", gpu_like, metric="actor/pg_loss")
    (v,) = curves.compare(run, gpu_baseline).failures
    assert v.statistic == "coverage" and "does not log critic/rewards/mean" in v.detail


def test_baseline_roundtrip_refuses_overwrite_and_unknown_versions(gpu_baseline, tmp_path):
    path = gpu_baseline.save(tmp_path / "golden.json")
    loaded = load_baseline(path)
    ref = loaded.metrics[REWARD]
    assert ref.steps == tuple(range(1, 31)) and ref.n_runs == 5
    assert ref.center == pytest.approx(gpu_baseline.metrics[REWARD].center)
    doc = json.loads(path.read_text())
    assert {"start_step", "end_step", "step_interval", "values"} <= set(doc["metrics"][REWARD])  # Megatron shape
    assert doc["provenance"]["hardware"] == "cpu" and doc["provenance"]["date"]
    with pytest.raises(BadInput, match="already exists; pass --force"):
        gpu_baseline.save(path)
    doc["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match=f"schema_version {SCHEMA_VERSION + 1} is not supported"):
        load_baseline(path)


def _write_filelogger(path, run: Run):
    lines = [json.dumps({"step": s, "data": {m: run[m].as_dict()[s] for m in run.series}}) for s in run.steps]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_cli_compare_and_record_exit_codes(tmp_path, capsys):
    refs = [_write_filelogger(tmp_path / f"gpu{i}.jsonl", make_run(f"gpu{i}", gpu_like, seed=i)) for i in range(3)]
    good = _write_filelogger(tmp_path / "good.jsonl", make_run("good", gpu_like, seed=50))
    bad = _write_filelogger(tmp_path / "npu.jsonl", make_run("npu", npu_after_two_fixes, seed=51))
    golden = str(tmp_path / "golden.json")
    # one reference run per file: separate runs, not segments of one
    assert cli_main(["baseline", "record", *refs[:1], "--out", golden]) == 0
    assert cli_main(["baseline", "record", *refs[:1], "--out", golden]) == 2  # no overwrite without --force
    assert "--force" in capsys.readouterr().err
    assert cli_main(["compare", good, golden]) == 0
    assert "good vs golden: ALIGNED" in capsys.readouterr().out
    assert cli_main(["compare", bad, *refs, "--json", "--plot", str(tmp_path / "cmp.png")]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["aligned"] is False and any(v["statistic"] == "trend" and v["passed"] is False for v in out["verdicts"])
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["compare", str(tmp_path / "missing.jsonl"), golden]) == 2
    assert cli_main(["compare", golden, golden]) == 2  # a golden cannot be the candidate
    assert cli_main(["compare", good, golden, "--metric", "actor/nope"]) == 2
    capsys.readouterr()


def test_cli_record_takes_tolerances_as_data(tmp_path, capsys):
    """`baseline record --tolerance` writes a tighter band into the golden (the tiny verl golden's fp32
    rollout/actor agreement); a malformed one is bad input naming the option."""
    from harness.metrics.baseline import load_baseline

    refs = [_write_filelogger(tmp_path / f"gpu{i}.jsonl", make_run(f"gpu{i}", gpu_like, seed=i)) for i in range(2)]
    golden = tmp_path / "golden.json"
    metric = "critic/rewards/mean"
    assert cli_main(["baseline", "record", *refs, "--out", str(golden),
                     "--tolerance", f"{metric}:band_atol=0.001,trend_steps=5"]) == 0
    tol = load_baseline(golden).metrics[metric].tolerance
    assert (tol.band_atol, tol.trend_steps, tol.window_atol) == (0.001, 5, 0.05)
    assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                     "--tolerance", f"{metric}:nope=1"]) == 2
    assert "--tolerance" in capsys.readouterr().err
