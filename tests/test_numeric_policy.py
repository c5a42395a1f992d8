"""One numeric policy (harness.numeric) for everything read from JSON, logs and the command line: integers bounded
before they reach range/len/arrays/sleeps, finite floats within what a metric can take, step times that are real
durations, statistics that cannot overflow, and no `Infinity`/`NaN` ever printed as JSON. Each case below
crashed with OverflowError/ValueError, or gave a wrong verdict, before."""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from hostile_json import SETTINGS, extreme_numbers
from hypothesis import given
from hypothesis import strategies as st

from fixtures.report import make_report
from harness import numeric
from harness.cli import main
from harness.errors import BadInput
from harness.metrics import stats
from harness.report.schema import write_report


def _cli(argv, cwd=None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            (contextlib.chdir(cwd) if cwd else contextlib.nullcontext()):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _exit_2(argv, *names, cwd=None) -> str:
    code, out, err = _cli(argv, cwd)
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, out[-500:], err)
    for name in names:
        assert name in err, (name, err)
    return err


def _runs(tmp_path, n=3, steps=20, value=lambda s, i: 0.02 * s + 0.01 * i, step_time=lambda s, i: 10.0 + i):
    paths = []
    for i in range(n):
        path = tmp_path / f"r{i}.jsonl"
        path.write_text("".join(json.dumps({"step": s, "data": {
            "critic/rewards/mean": value(s, i), "timing_s/step": step_time(s, i), "perf/total_num_tokens": 5000.0}})
            + "\n" for s in range(1, steps + 1)))
        paths.append(path)
    return paths


@pytest.fixture
def golden(tmp_path):
    runs = _runs(tmp_path)
    assert _cli(["baseline", "record", *runs, "--out", tmp_path / "golden.json"])[0] == 0
    return json.loads((tmp_path / "golden.json").read_text())


def _write(tmp_path, doc, name="edited.json"):
    (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path / name


def test_a_golden_with_end_step_10_300_is_one_line(tmp_path, golden):
    # seeded: OverflowError (Python int too large to convert to C ssize_t) in _curve_from_json's len(range)
    golden["metrics"]["critic/rewards/mean"]["end_step"] = 10**300
    path = _write(tmp_path, golden)
    _exit_2(["compare", tmp_path / "r0.jsonl", path], "edited.json", "end_step")


def test_a_golden_starting_at_step_2_70_is_refused_not_aligned(tmp_path, golden):
    # seeded: ALIGNED with every reward statistic silently skipped (no candidate step near 2**70)
    entry = golden["metrics"]["critic/rewards/mean"]
    entry["start_step"] = 2**70
    entry["end_step"] = 2**70 + len(entry["values"]) - 1
    _exit_2(["compare", tmp_path / "r0.jsonl", _write(tmp_path, golden)], "edited.json", "start_step")


def test_golden_values_near_the_float_limit_are_refused(tmp_path, golden):
    # seeded: OverflowError in the sums and squares of harness.metrics.stats
    entry = golden["metrics"]["critic/rewards/mean"]
    for run in entry["runs"]:
        run["values"] = [1.7e308 * (1 if i % 2 else -1) for i in range(len(run["values"]))]
    _exit_2(["compare", tmp_path / "r0.jsonl", _write(tmp_path, golden)], "edited.json")


@pytest.mark.parametrize("command", ["compare", "record"])
def test_runs_with_values_near_the_float_limit_give_a_verdict_or_one_line(tmp_path, command):
    # seeded: OverflowError from fmean/variance over reference runs logging 1e308
    runs = _runs(tmp_path, value=lambda s, i: 1e308 if s % 3 == 0 else 0.02 * s)
    argv = ["compare", runs[0], *runs] if command == "compare" else \
        ["baseline", "record", *runs, "--out", tmp_path / "g.json"]
    code, out, err = _cli(argv)
    assert code in (1, 2) and "Traceback" not in err, (code, out, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "1e+308" in err, err


@pytest.mark.parametrize("option", ["--devices", "--sequences", "--warmup"])
def test_throughput_count_options_are_bounded(tmp_path, option):
    # seeded: OverflowError (int too large to convert to float) from --devices 10**400
    (run,) = _runs(tmp_path, n=1)
    _exit_2(["throughput", run, "--hardware", "a2", option, "1" + "0" * 400], option)
    _exit_2(["throughput", run, "--hardware", "a2", option, "-5"], option)


def test_a_subnormal_step_time_is_refused_not_infinite_tps(tmp_path):
    # seeded: 5e-324 s per step gave TPS inf, which passed --target 100, and --json printed Infinity
    (run,) = _runs(tmp_path, n=1, step_time=lambda s, i: 5e-324 if s == 5 else 10.0)
    err = _exit_2(["throughput", run, "--hardware", "a2", "--devices", "8", "--target", "100", "--json"], "r0.jsonl")
    assert "step 5" in err and "timing_s/step" in err


def test_json_output_is_never_infinity():
    # the last line of defence behind the validators: a non-finite float prints as null (orjson's choice too)
    text = numeric.json_text({"tps": math.inf, "values": [1.0, math.nan, -math.inf], "ok": True})
    assert json.loads(text) == {"tps": None, "values": [1.0, None, None], "ok": True}
    assert "Infinity" not in text and "NaN" not in text


def test_trend_durations_near_the_float_limit_are_refused(tmp_path):
    # seeded: LinAlgError from plot_trend over a store whose nights took 1e308 s
    store = tmp_path / "store"
    for i in range(3):
        doc = make_report(f"night-{i}", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0).to_dict()
        doc["duration_s"] = 1e308 if i == 2 else 10.0
        store.mkdir(exist_ok=True)
        (store / f"night-{i}.json").write_text(json.dumps(doc))
    code, out, err = _cli(["report", store, "-o", tmp_path / "out"])
    assert code in (0, 1) and "night-2.json" in out + err and "duration_s" in out + err, (code, out, err)
    assert (tmp_path / "out" / "trend.html").is_file()


@pytest.mark.parametrize(("argv", "option"), [
    (["lab", "--seed", "-1", "--out", "x"], "--seed"),
    (["lab", "--seed", str(2**64), "--out", "x"], "--seed"),
    (["launch", "--scale", "tiny", "--k8s", "--seed", "-1"], "--seed"),
    (["launch", "--scale", "tiny", "--k8s", "--steps", str(10**30)], "--steps"),
    (["launch", "--scale", "tiny", "--local", "--timeout", "1e300"], "--timeout"),
    (["run", "--workers", str(10**30)], "--workers"),
    (["run", "--workers", "-5"], "--workers"),
    (["run", "--workers", "0"], "--workers"),
    (["memory", "--scale", "tiny", "--gbs", str(10**30)], "--gbs"),
    (["memory", "--scale", "tiny", "--micro-batch", "-1"], "--micro-batch"),
    (["throughput", "x.jsonl", "--target", "1e309"], "--target"),
    (["throughput", "x.jsonl", "--tolerance", "nan"], "--tolerance"),
])
def test_every_numeric_option_has_a_validator(tmp_path, argv, option):
    # seeded: lab --seed -1 crashed in numpy, run --workers 10**30 in xdist, --workers -5 was accepted
    _exit_2(argv, option, cwd=tmp_path)


def test_a_tolerance_pool_of_1e309_is_one_line(tmp_path):
    # seeded: OverflowError (cannot convert float infinity to integer) in baseline record --tolerance
    runs = _runs(tmp_path)
    _exit_2(["baseline", "record", *runs, "--out", tmp_path / "g.json", "--tolerance",
             "critic/rewards/mean:pool=1e309"], "pool")
    _exit_2(["baseline", "record", *runs, "--out", tmp_path / "g.json", "--tolerance",
             "critic/rewards/mean:band_atol=1e309"], "band_atol")


@SETTINGS
@given(extreme_numbers, st.sampled_from(["count", "step", "metric", "seconds"]))
def test_the_policy_accepts_exactly_its_ranges(value, kind):
    # every accepted number is one the arithmetic downstream can take; every refusal is one line naming it
    check = {"count": lambda v: numeric.integer(v, "x", high=numeric.MAX_COUNT),
             "step": lambda v: numeric.integer(v, "x", high=numeric.MAX_STEP),
             "metric": lambda v: numeric.real(v, "x"), "seconds": lambda v: numeric.seconds(v, "x")}[kind]
    try:
        got = check(value)
    except BadInput as exc:
        assert "\n" not in str(exc) and str(exc).startswith("x ")
        return
    assert not isinstance(got, bool) and math.isfinite(float(got))
    if kind in ("count", "step"):
        len(range(0, got + 1))  # fits a C ssize_t
    if kind == "seconds":
        assert 1e4 / got < math.inf and got > 0


@SETTINGS
@given(st.lists(st.lists(st.floats(min_value=-numeric.METRIC_LIMIT, max_value=numeric.METRIC_LIMIT), min_size=3,
                         max_size=5).map(tuple), min_size=1, max_size=6), st.integers(min_value=0, max_value=50))
def test_band_statistics_stay_finite_within_the_metric_range(columns, pool):
    # values within the policy's range: the pooled spread and the prediction half-width never overflow
    width = min(len(c) for c in columns)
    columns = [c[:width] for c in columns]
    for s, df in stats.pooled_spreads(columns, pool):
        assert math.isfinite(s) and math.isfinite(stats.prediction_half_width(s, df, width, 0.998))
    assert all(math.isfinite(stats.centre(c)) for c in columns)


def test_report_fields_use_the_policy(tmp_path):
    doc = make_report("n", "2026-11-01T02:00:00+00:00").to_dict()
    doc["machine"]["cpu_count"] = 10**30
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    _exit_2(["report", path, "-o", tmp_path / "out"], "cpu_count")
    write_report(make_report("n", "2026-11-01T02:00:00+00:00"), path)
    assert _cli(["report", path, "-o", tmp_path / "out"])[0] == 0
