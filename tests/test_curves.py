"""Self-tests of harness.metrics.curves, .baseline and .stats: each statistic fails on the shape it exists for (seed
001's -0.8 vs -0.6, a windowed offset, spikes, NaN, a run that stops early) and passes on a run drawn like the
references; bands from few runs are Student-t prediction intervals (the old k*std per step is the seeded bug),
robust to one bad reference; one or two reference runs are judged by their step noise (seed 001's one-vs-one case
fails, a clean one passes; the old floors-only verdict is the seeded bug); windows count from the
first logged step (resumed runs); same-seed runs compare exactly; rollout_probs_diff floors follow the precision;
sanity limits need no baseline; goldens round-trip and refuse malformed or unknown-version files; the CLI exits
0/1/2 with one line naming the file or option."""
from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from harness.cli import main as cli_main
from harness.errors import BadInput
from harness.metrics import curves, stats
from harness.metrics.baseline import (
    SCHEMA_VERSION,
    Baseline,
    CurveTolerance,
    default_tolerance,
    despiked,
    load_baseline,
)
from harness.metrics.keys import ROLLOUT_PROBS_DIFF
from harness.metrics.run import Run, RunMeta, Series

REWARD = "critic/rewards/mean"


def make_run(name, fn, steps=30, noise=0.02, seed=0, metric=REWARD, first=1, extra=None) -> Run:
    rng = random.Random(seed)
    s = tuple(range(first, first + steps))
    return Run(name, {metric: Series(s, tuple(fn(x) + rng.gauss(0, noise) for x in s))},
               RunMeta(scale="tiny", hardware="cpu", versions={"verl": "0.9.1"}, sources=(f"{name}.jsonl",),
                       extra={"seed": seed, **(extra or {})}))


def gpu_like(step):  # seed 001: the GPU baseline reached -0.6 after 10 steps, then kept rising
    return -0.9 + 0.03 * min(step, 10) + 0.005 * max(step - 10, 0)


def npu_after_two_fixes(step):  # seed 001: the 671B on NPU reached only -0.8 after 10 steps
    return -0.9 + 0.01 * min(step, 10) + 0.005 * max(step - 10, 0)


@pytest.fixture
def gpu_baseline():
    return Baseline.from_runs([make_run(f"gpu{i}", gpu_like, seed=i) for i in range(5)], (REWARD,))


def test_seed001_shape_fails_and_says_where(gpu_baseline):
    alignment = curves.compare(make_run("npu", npu_after_two_fixes, seed=99), gpu_baseline)
    assert alignment.state == curves.MISALIGNED and not alignment.passed
    failed = {v.statistic: v for v in alignment.failures}
    assert {"band", "window-mean", "trend"} <= set(failed), alignment.summary()
    trend = failed["trend"]
    assert trend.value == pytest.approx(0.01, abs=0.006) and trend.reference == pytest.approx(0.03, abs=0.006)
    assert "steps 1-10" in trend.message() and "slope" in trend.detail
    assert failed["window-mean"].where == "steps 5-14"


def test_a_run_drawn_like_the_references_passes(gpu_baseline):
    for seed in range(100, 110):
        alignment = curves.compare(make_run("gpu-new", gpu_like, seed=seed), gpu_baseline)
        assert alignment.passed, alignment.summary() + "; ".join(v.message() for v in alignment.failures)


def test_band_is_a_calibrated_student_t_interval_and_the_old_k_std_is_not():
    """On Gaussian noise the pooled Student-t prediction interval holds its nominal rate; the old per-step
    4*std*sqrt(1+1/N) from 3 runs (the seeded bug: 24 % false alarms on clean lab runs) does not."""
    rng, n, confidence, trials = random.Random(7), 3, 0.99, 4000
    ours = old = 0
    for _ in range(trials):
        block = [[rng.gauss(0, 1) for _ in range(n)] for _ in range(5)]  # a step and 2 neighbours each side
        s, df = stats.robust_spread([[v - stats.centre(col) for v in col] for col in block])
        assert df == 10
        new, column = rng.gauss(0, 1), block[2]
        ours += abs(new - stats.centre(column)) > stats.prediction_half_width(s, df, n, confidence)
        mean = sum(column) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in column) / (n - 1))
        old += abs(new - mean) > 4 * sd * math.sqrt(1 + 1 / n)
    nominal = 1 - confidence
    assert ours / trials < 2 * nominal, f"pooled Student-t band exceeded {ours / trials:.2%} (nominal {nominal:.0%})"
    assert old / trials > 4 * nominal, f"the old k*std band exceeded only {old / trials:.2%}"
    assert stats.t_quantile(10, 0.99) == pytest.approx(3.169, abs=1e-3)  # textbook t(10), two-sided 99 %


@pytest.mark.parametrize("steps", [15, 30])
def test_the_noise_model_is_worth_its_effective_degrees_of_freedom(steps):
    """A one-run golden's t quantile takes the noise model's df. Re-simulated (white Gaussian noise around a line):
    the spread of its sigma^2 is that of a chi-square with stats.EFFECTIVE_DF's df, and its 1 % lower tail is the
    one that df promises. The seeded bug is the count of differences (13 for 15 steps), which promises a sigma
    below 0.56x the truth in 1 % of runs where 0.39x happens: the golden of the tiny verl recipe too narrow to
    pass 7 of 20 clean seeds."""
    from scipy.stats import chi2

    rng = random.Random(steps)
    sigma2 = sorted(stats.pooled_noise([[t / steps + rng.gauss(0, 1) for t in range(steps)]]).sigma ** 2
                    for _ in range(4000))
    mean = sum(sigma2) / len(sigma2)
    measured = 2 / (sum((v - mean) ** 2 for v in sigma2) / len(sigma2) / mean ** 2)
    df = stats.pooled_noise([[float(t % 3) for t in range(steps)]]).df
    assert df == round(stats.effective_df(steps - 2))
    assert measured == pytest.approx(df, rel=0.15), f"sigma^2 spreads like df {measured:.1f}, the model says {df}"
    low = sigma2[len(sigma2) // 100] / mean
    assert low == pytest.approx(chi2.ppf(0.01, df) / df, abs=0.05)
    assert low < chi2.ppf(0.01, steps - 2) / (steps - 2) - 0.08  # the count of differences promised too much


def test_one_bad_reference_does_not_widen_every_band():
    good = [make_run(f"r{i}", gpu_like, seed=i) for i in range(4)]
    bad = make_run("bad", lambda s: gpu_like(s) + 1.0, seed=9)  # e.g. a reference from a broken build
    clean = Baseline.from_runs(good, (REWARD,)).metrics[REWARD]
    spoiled = Baseline.from_runs([*good, bad], (REWARD,)).metrics[REWARD]
    widths = [spoiled.half_width(i) / clean.half_width(i) for i in range(len(clean.steps))]
    # clipped at 2.5 robust SDs, the bad run adds a bounded amount (most at the curve's ends, where fewer steps pool)
    assert max(widths) < 3.0, f"one bad run widened the band {max(widths):.1f}x"
    assert max(abs(a - b) for a, b in zip(spoiled.center, clean.center, strict=True)) < 0.05  # the median holds
    # the seeded bug: mean +- k*std per step, as before, is widened ~25x by the same run
    column = [gpu_like(10) + v for v in (0.0, 0.01, -0.01, 0.02, 1.0)]
    mean = sum(column) / 5
    assert 4 * math.sqrt(sum((v - mean) ** 2 for v in column) / 4) > 10 * clean.half_width(9)


def seed001_npu(step):  # seed 001's curve shape: NPU -0.88 -> -0.78 by step 10, then flat
    return -0.88 + 0.01 * min(step, 10)


def seed001_gpu(step):  # the GPU reference: -0.88 -> -0.62 by step 10, then flat
    return -0.88 + 0.026 * min(step, 10)


@pytest.mark.parametrize("n_runs", [1, 2])
def test_one_or_two_reference_runs_are_judged_by_their_noise(n_runs):
    """The most common real comparison, one reference run against one candidate (seed 003; before vs after an
    upgrade): seed 001's case fails, a clean draw of the reference passes, and the verdict says what it was judged
    by. The seeded bug is the old "floors only, never failing" verdict below 3 runs: it let seed 001 pass."""
    refs = Baseline.from_runs([make_run(f"gpu{i}", seed001_gpu, steps=30, noise=0.02, seed=i)
                               for i in range(n_runs)], (REWARD,))
    npu = curves.compare(make_run("npu", seed001_npu, steps=30, noise=0.02, seed=50), refs)
    assert npu.state == curves.MISALIGNED and not npu.passed, npu.summary()
    failed = {v.statistic: v for v in npu.failures}
    assert "window-mean" in failed and "noise model sd" in failed["window-mean"].detail, npu.summary()
    assert f"{n_runs} reference run" in npu.summary()
    clean = [curves.compare(make_run("gpu-new", seed001_gpu, steps=30, noise=0.02, seed=s), refs)
             for s in range(60, 70)]
    assert sum(not a.passed for a in clean) <= 1, [a.summary() for a in clean if not a.passed]
    # non-finite values fail whatever the number of runs
    nan = curves.compare(make_run("nan", lambda s: math.nan if s == 12 else seed001_gpu(s), noise=0.0), refs)
    assert nan.state == curves.MISALIGNED and "non-finite at steps [12]" in nan.failures[0].detail


def test_three_runs_that_agree_closely_cannot_shrink_the_band_to_nothing():
    """The unlucky golden: three runs whose window statistics nearly coincide (the spread across them ~0) while
    their step noise is not. Trusting their spread alone flags most clean candidates; shrunk toward the noise
    model, the interval stays near what the noise allows."""
    runs = [make_run(f"r{i}", gpu_like, noise=0.05, seed=i) for i in range(3)]
    ref = Baseline.from_runs(runs, (REWARD,)).metrics[REWARD]
    alike = [2.0, 2.0001, 2.0002]
    _, trusting_spread, _ = dataclasses.replace(ref, runs=ref.runs).predict(alike, 0.0)
    _, shrunk, how = ref.predict(alike, 0.05)
    assert trusting_spread < 0.01 < 0.1 < shrunk and "spread of 3 runs" in how
def test_band_allows_a_stretch_of_outliers_not_more(gpu_baseline):
    def spiky(steps):
        return lambda s: gpu_like(s) - (0.5 if s in steps else 0.0)  # a lower reward: the side that fails

    assert curves.compare(make_run("stretch", spiky(set(range(18, 24))), seed=7), gpu_baseline).passed
    bad = curves.compare(make_run("spikes", spiky(set(range(16, 23))), seed=7), gpu_baseline)
    band = next(v for v in bad.failures if v.statistic == "band")
    assert band.detail.startswith("7 of 30 steps outside the band (allowed 6)")


# ---- heavy tails: a spike is an event (issue 31) ------------------------------------------------------------------
GRAD_NORM = "actor/grad_norm"


def grad_norm_like(step):  # the lab's actor/grad_norm: ~2.5 with noise ~0.3 per step, flat
    return 2.5


def _spiked(run: Run, metric: str, step: int, value: float) -> Run:
    series = run[metric]
    values = tuple(value if s == step else v for s, v in zip(series.steps, series.values, strict=True))
    return dataclasses.replace(run, series={**run.series, metric: Series(series.steps, values)})


@pytest.fixture
def grad_norm_golden():
    return Baseline.from_runs([make_run(f"g{i}", grad_norm_like, noise=0.3, seed=i, metric=GRAD_NORM)
                               for i in range(5)], (GRAD_NORM,))


def _scaled(run: Run, metric: str, factor: float) -> Run:
    series = run[metric]
    return dataclasses.replace(run, series={**run.series, metric: Series(series.steps, tuple(
        v * factor for v in series.values))})


def test_a_20x_smaller_grad_norm_fails_though_its_linear_band_reaches_zero(monkeypatch):
    """Issue 31: the tiny golden's grad_norm band reached below 0 (its noise is 20 % of its level, inflated for
    other seeds), so a run with 20x smaller advantages (grad_norm / 20; Adam then takes the same steps) sat inside
    it. A positive metric's lower edge now stops at reference^2 / (4 bound) below half the centre. The run fails on
    the band and the window, and a clean one passes. The seeded bug is the linear lower edge: the same run then
    passes the band and is caught by one statistic at most (issue 31: the window mean alone)."""
    golden = Baseline.from_runs([make_run(f"g{i}", grad_norm_like, noise=0.5, seed=i, metric=GRAD_NORM)
                                 for i in range(3)], (GRAD_NORM,))
    ref = golden.metrics[GRAD_NORM]
    assert ref.positive and ref.half_width(0) > ref.band_center[0], "the case needs a band reaching below 0"
    clean = make_run("cand", grad_norm_like, noise=0.5, seed=40, metric=GRAD_NORM)
    small = _scaled(clean, GRAD_NORM, 1 / 20)
    assert curves.compare(clean, golden).passed
    alignment = curves.compare(small, golden)
    assert {"band", "window-mean"} <= {v.statistic for v in alignment.failures}, alignment.message()
    assert "lower edge" in next(v.detail for v in alignment.failures if v.statistic == "band")
    linear = curves.edges
    monkeypatch.setattr(curves, "edges", lambda metric, reference, bound, positive=False: linear(
        metric, reference, bound))  # the old, linear band
    old = {v.statistic for v in curves.compare(small, golden).failures}
    assert "band" not in old and len(old) <= 1, old


def test_the_lower_edge_is_linear_down_to_half_the_centre_then_hyperbolic():
    """edges(): the calibrated linear edge wherever it stays above half the centre; beyond, reference^2 / (4 bound),
    continuous with it and with the same slope there, always above 0; a metric with a value <= 0 is not positive;
    the better side is open."""
    for r in (0.1, 0.3, 0.5):
        assert curves.edges(GRAD_NORM, 2.0, 2.0 * r, positive=True) == (2.0 - 2.0 * r, 2.0 + 2.0 * r)
    lows = [curves.edges(GRAD_NORM, 2.0, 2.0 * r, positive=True)[0] for r in (0.5, 0.5 + 1e-6, 1.0, 3.0, 30.0)]
    assert lows == sorted(lows, reverse=True) and all(low > 0 for low in lows), lows
    assert lows[1] == pytest.approx(1.0 - 2e-6, abs=1e-9)  # slope -1 at bound = reference / 2, as the linear edge
    assert lows[2:] == [0.5, pytest.approx(1 / 6), pytest.approx(1 / 60)]  # twice as wide: twice as low
    assert curves.edges(GRAD_NORM, 2.0, 6.0)[0] == -4.0  # not positive: linear
    assert curves.edges(REWARD, -0.5, 0.2)[1] == math.inf
    runs = [make_run(f"g{i}", lambda s: 0.1, noise=0.2, seed=i, metric=GRAD_NORM) for i in range(2)]
    assert not Baseline.from_runs(runs, (GRAD_NORM,)).metrics[GRAD_NORM].positive  # some values <= 0


@pytest.mark.parametrize("factor", [3, 6, 10])
def test_one_spike_is_an_event_and_moves_no_window_mean(grad_norm_golden, monkeypatch, factor):
    """Issue 31: one grad-norm step of 11.6 among ~2.5s false-alarmed the window mean of clean runs, and one
    seeded spike x6 the median flagged 40 % of clean candidates at N=5. The spike is named by the spikes verdict
    and replaced in the window: the run passes. The seeded bug is the old statistic, which took the spike into the
    window mean (despiking switched off): the same run fails on window-mean."""
    clean = make_run("cand", grad_norm_like, noise=0.3, seed=40, metric=GRAD_NORM)
    assert curves.compare(clean, grad_norm_golden).passed
    spiky = _spiked(clean, GRAD_NORM, 8, factor * 2.5)
    alignment = curves.compare(spiky, grad_norm_golden)
    assert alignment.passed, alignment.message()
    spikes = next(v for v in alignment.verdicts if v.statistic == "spikes")
    assert spikes.passed and spikes.where == "step 8" and spikes.detail.startswith("1 spike in 30 steps (step 8: ")
    monkeypatch.setattr(curves, "despiked", lambda series, tol, cap: (series, ()))  # the old verdict
    old = curves.compare(spiky, grad_norm_golden)
    assert "window-mean" in {v.statistic for v in old.failures}, old.message()


def test_spikes_fail_on_their_rate_and_on_their_size(grad_norm_golden):
    """Bounded against the golden's runs: five clean 30-step runs allow 2 spikes in 30 steps (their rate, 0 in
    150, bounds it), not 5; one spike the tolerance's spike_limit x the level or more (a broken update, NeMo-RL's
    1e6) fails alone. A NaN is no spike: it fails the band as itself."""
    clean = make_run("cand", grad_norm_like, noise=0.3, seed=41, metric=GRAD_NORM)
    many = clean
    for step in (5, 10, 15, 20, 25):
        many = _spiked(many, GRAD_NORM, step, 15.0)
    failed = {v.statistic: v for v in curves.compare(many, grad_norm_golden).failures}
    assert set(failed) == {"spikes"}, failed
    assert failed["spikes"].detail.startswith("5 spikes in 30 steps") and "up to 2 allowed" in failed["spikes"].detail
    huge = curves.compare(_spiked(clean, GRAD_NORM, 12, 1e6), grad_norm_golden)
    assert [v.statistic for v in huge.failures] == ["spikes"], huge.message()
    # verl logs the gradient norm before clipping: a clean warm-started run spiked to 51x and 239x its level, and
    # one spike that size is no broken update (a 20x limit flagged 9 of 90 clean one-run comparisons)
    clipped = curves.compare(_spiked(clean, GRAD_NORM, 12, 240 * 2.5), grad_norm_golden)
    assert clipped.passed, clipped.message()
    nan = curves.compare(_spiked(clean, GRAD_NORM, 12, math.nan), grad_norm_golden)
    assert {"band", "spikes"} & {v.statistic for v in nan.failures} == {"band"}, nan.message()


def test_a_share_that_bursts_is_judged_by_its_level_not_as_spikes():
    """A clip fraction near 0 clips 5x more tokens for a step here and there, more often in some clean seeds than in
    others: its tolerance judges no spikes (the seeded bug: judged as events, a clean seed's 5 bursts in 28 steps
    failed against a golden with none). A share that moves its level still fails, on its band and window."""
    clipfrac = "actor/pg_clipfrac"
    golden = Baseline.from_runs([make_run(f"g{i}", lambda t: 0.03, noise=0.005, seed=i, metric=clipfrac)
                                 for i in range(2)], (clipfrac,))
    assert golden.metrics[clipfrac].tolerance.spike_limit is None
    bursty = make_run("cand", lambda t: 0.03, noise=0.005, seed=9, metric=clipfrac)
    for step in (8, 10, 14, 16, 18):
        bursty = _spiked(bursty, clipfrac, step, 0.15)
    alignment = curves.compare(bursty, golden)
    assert alignment.passed and "spikes" not in {v.statistic for v in alignment.verdicts}, alignment.message()
    shifted = curves.compare(make_run("cand", lambda t: 0.3, noise=0.005, seed=9, metric=clipfrac), golden)
    assert {"band", "window-mean"} <= {v.statistic for v in shifted.failures}, shifted.message()
    with pytest.raises(BadInput, match="tolerance spikes 'no'"):
        CurveTolerance.from_json({"band_atol": 0.02, "spikes": "no"}, "g.json")


def test_a_stored_tolerance_keeps_its_metrics_spike_policy(tmp_path):
    """A golden recorded before `spike_limit` takes its metric's (the gradient norm's 1e4x: the seeded bug, the
    generic 20x, flagged 9 of 90 clean one-run comparisons of the warm-started lab); one of the release that stored
    `"spikes": true|false` reads as the metric's limit or as none; a limit below 1x is refused."""
    clipfrac = "actor/pg_clipfrac"
    assert CurveTolerance.from_json({"band_atol": 0.5}, "g.json", GRAD_NORM).spike_limit == 1e4
    assert CurveTolerance.from_json({"band_atol": 0.5}, "g.json", REWARD).spike_limit == 20
    assert CurveTolerance.from_json({"band_atol": 0.5}, "g.json", "user/metric").spike_limit == 20
    assert CurveTolerance.from_json({"band_atol": 0.02}, "g.json", clipfrac).spike_limit is None
    assert CurveTolerance.from_json({"band_atol": 0.5, "spikes": True}, "g.json", GRAD_NORM).spike_limit == 1e4
    assert CurveTolerance.from_json({"band_atol": 0.5, "spikes": False}, "g.json", GRAD_NORM).spike_limit is None
    assert CurveTolerance.from_json({"band_atol": 0.02, "spikes": True}, "g.json", clipfrac).spike_limit == 20
    assert CurveTolerance.from_json({"band_atol": 0.5, "spike_limit": None}, "g.json", REWARD).spike_limit is None
    with pytest.raises(BadInput, match="spike_limit"):
        CurveTolerance.from_json({"band_atol": 0.5, "spike_limit": 0.5}, "g.json", REWARD)
    path = Baseline.from_runs([make_run(f"g{i}", grad_norm_like, noise=0.3, seed=i, metric=GRAD_NORM)
                               for i in range(2)], (GRAD_NORM,)).save(tmp_path / "g.json")
    doc = json.loads(path.read_text())
    del doc["metrics"][GRAD_NORM]["tolerance"]["spike_limit"]
    path.write_text(json.dumps(doc))
    assert load_baseline(path).metrics[GRAD_NORM].tolerance.spike_limit == 1e4


def test_a_golden_whose_runs_spike_allows_their_rate():
    """The golden's own spikes set the rate: runs that spike every ~6 steps allow a candidate that does."""
    def spiky_run(name, seed):
        run = make_run(name, grad_norm_like, noise=0.3, seed=seed, metric=GRAD_NORM)
        for step in range(4 + seed % 3, 28, 6):
            run = _spiked(run, GRAD_NORM, step, 9.0)
        return run

    golden = Baseline.from_runs([spiky_run(f"s{i}", i) for i in range(5)], (GRAD_NORM,))
    assert golden.metrics[GRAD_NORM].spikes[0] >= 20 and golden.metrics[GRAD_NORM].heavy_tailed
    alignment = curves.compare(spiky_run("cand", 42), golden)
    assert alignment.passed, alignment.message()
    window = next(v for v in alignment.verdicts if v.statistic == "window-mean")
    assert "trimmed mean: the golden's runs are heavy-tailed" in window.detail


def test_a_shift_is_not_a_spike_and_still_fails():
    """A spike must stand out from its neighbours on both sides: the first and last steps of an offset, and a
    monotone transient, are no spikes (the first rule, one median of both sides, called both ends of a 6-step
    offset spikes and hid them from the band); a sustained offset still fails the window on a heavy-tailed
    metric's trimmed mean."""
    steps = [0.0] * 10 + [1.0] * 6 + [0.0] * 10
    assert stats.find_spikes(steps) == ()
    assert stats.find_spikes([-1.6, -1.2, -1.0, -1.0, -0.95, -0.9, -0.9, -0.88]) == ()
    rng = random.Random(1)
    noisy = [rng.gauss(0, 0.1) for _ in range(20)]
    assert stats.find_spikes(noisy) == ()
    assert [s.index for s in stats.find_spikes(noisy[:10] + [3.0] + noisy[11:])] == [10]
    golden = Baseline.from_runs([_spiked(make_run(f"g{i}", grad_norm_like, noise=0.3, seed=i, metric=GRAD_NORM),
                                         GRAD_NORM, 20, 12.0) for i in range(3)], (GRAD_NORM,))
    assert golden.metrics[GRAD_NORM].heavy_tailed
    shifted = make_run("shift", lambda s: 2.5 + (1.5 if 5 <= s <= 14 else 0.0), noise=0.3, seed=43,
                       metric=GRAD_NORM)
    assert "window-mean" in {v.statistic for v in curves.compare(shifted, golden).failures}


def test_heavy_tails_are_decided_from_the_runs_not_the_metric_name():
    """Gaussian noise is not heavy-tailed whatever the metric is called; Student-t(2) noise (a kurtosis the
    Gaussian never reaches) is, under any name."""
    rng = random.Random(3)
    gauss = [[rng.gauss(0, 1) for _ in range(30)] for _ in range(3)]
    heavy = [[rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1, 1)) for _ in range(30)] for _ in range(3)]
    assert not stats.heavy_tailed(gauss) and stats.heavy_tailed(heavy)
    golden = Baseline.from_runs([make_run(f"g{i}", grad_norm_like, noise=0.3, seed=i, metric=GRAD_NORM)
                                 for i in range(5)], (GRAD_NORM,))
    assert not golden.metrics[GRAD_NORM].heavy_tailed  # grad_norm by name, Gaussian by data


def test_two_bursts_that_mask_each_other_are_spikes_against_the_goldens_noise(monkeypatch):
    """A clean verl run failed the committed golden on its grad-norm window mean: two bursts (6.5 and 5.0 around
    2.3, steps 11 and 14) raised the run's own noise estimate to 2.5x the seeds' median, so neither was a spike by
    SPIKE_Z x that noise, and both entered the window. A run's noise is now read from a first-difference SD of at
    most the bound of the golden's (MetricBaseline.spike_diff_cap): the same bursts, 14 and 9 noise SDs, in 20 seeds
    of 15 steps against a 5-run golden whose noise reads low (0.23 for a true 0.3: the band is narrow, as the
    committed verl golden's was). Seeded bug: the run's own noise alone (the bound infinite): the larger burst is
    missed in 8 of 20 runs and most of them fail; against wider goldens (seeds 5-19) they fail less often, while the
    bursts are missed as often."""
    def aligned() -> tuple[int, int]:
        golden = Baseline.from_runs([make_run(f"g{i}", grad_norm_like, steps=15, noise=0.3, seed=i,
                                              metric=GRAD_NORM) for i in range(5)], (GRAD_NORM,))
        ref = golden.metrics[GRAD_NORM]
        passed = found = 0
        for seed in range(40, 60):
            clean = make_run("cand", grad_norm_like, steps=15, noise=0.3, seed=seed, metric=GRAD_NORM)
            burst = _spiked(_spiked(clean, GRAD_NORM, 11, 6.7), GRAD_NORM, 14, 5.2)
            passed += curves.compare(burst, golden).passed
            found += 10 in {s.index for s in despiked(burst[GRAD_NORM], ref.tolerance, ref.spike_diff_cap)[1]}
        return passed, found

    passed, found = aligned()
    assert found == 20 and passed >= 18, (found, passed)
    monkeypatch.setattr(stats, "noise_bound", lambda *args, **kwargs: math.inf)
    passed, found = aligned()
    assert found <= 14 and passed <= 10, (found, passed)


def test_the_noise_bound_is_the_chi_square_upper_bound():
    """sd sqrt(df / chi2_0.01(df)): 1.42x for five 15-step runs (df 30), 2.6x for one (df 6); no bound where the
    estimate says nothing (no df, an SD of 0 or NaN: a constant golden must not make every step a spike)."""
    from scipy.stats import chi2

    assert stats.noise_bound(0.5, 30) == pytest.approx(0.5 * math.sqrt(30 / chi2.ppf(0.01, 30)))
    assert stats.noise_bound(1.0, 30) == pytest.approx(1.416, abs=1e-3)
    assert stats.noise_bound(1.0, 6) == pytest.approx(2.623, abs=1e-3)
    assert all(stats.noise_bound(sd, df) == math.inf for sd, df in ((1.0, 0), (0.0, 30), (math.nan, 30)))


def test_the_robust_centres_are_scipys():
    """trimmed_mean and theil_sen are written out for speed; they must stay scipy's definitions."""
    from scipy.stats import theilslopes, trim_mean

    rng = random.Random(5)
    for n in (7, 9, 10, 12):
        values = [rng.gauss(0, 1) for _ in range(n)]
        steps = list(range(1, n + 1))
        assert stats.trimmed_mean(values) == pytest.approx(float(trim_mean(values, stats.TRIM)))
        assert stats.theil_sen(steps, values) == pytest.approx(float(theilslopes(values, steps).slope))


def test_spike_allowance_is_the_predictive_quantile():
    # one clean 30-step golden cannot bound a rare event's rate: several spikes allowed; five clean runs allow 2;
    # a golden that spiked allows more
    assert stats.spike_allowance(0, 30, 30, 0.998) > stats.spike_allowance(0, 150, 30, 0.998) == 2
    assert stats.spike_allowance(10, 150, 30, 0.998) > stats.spike_allowance(2, 150, 30, 0.998)


def test_nan_always_fails_the_band(gpu_baseline):
    run = make_run("nan", lambda s: math.nan if s == 12 else gpu_like(s), seed=3)
    (band,) = [v for v in curves.compare(run, gpu_baseline).failures if v.statistic == "band"]
    assert "non-finite at steps [12]" in band.detail


def test_a_run_too_short_for_a_statistic_is_not_judged_on_it(gpu_baseline):
    """Said as such, never passed, never a failure that buries the real ones (a 3-step stale run once read "9
    passed, 11 failed" where 10 of the 11 were "cannot fill the window")."""
    short = curves.compare(make_run("short", gpu_like, steps=8, seed=5), gpu_baseline)
    assert short.passed and {v.statistic for v in short.verdicts if v.passed is None} == {"window-mean", "trend"}
    window = next(v for v in short.verdicts if v.statistic == "window-mean")
    assert "not judged: run too short" in window.detail and "it has 4 of its 10 steps" in window.detail
    assert "2 not judged (2 for a run too short)" in short.summary()
    broken = curves.compare(make_run("short-broken", lambda s: gpu_like(s) - 0.5, steps=3, seed=5), gpu_baseline)
    # 3 steps: no step has 3 neighbours on each side, so its spikes are not judged either (stats.SPIKE_NEIGHBOURS)
    expected = "1 failed (critic/rewards/mean band), 1 passed, 4 not judged (4 for a run too short); 5 reference runs"
    assert broken.summary().split(": ")[1:3] == ["MISALIGNED", expected]


def test_window_counts_from_the_first_logged_step_of_a_resumed_run():
    # references logged steps 1-130; the candidate resumed from a step-100 checkpoint logs from 101 (verl restores
    # global_steps), so its window is 105-114 and its trend 101-110, judged against the references' same steps
    refs = Baseline.from_runs([make_run(f"r{i}", gpu_like, steps=130, seed=i) for i in range(4)], (REWARD,))
    resumed = make_run("resumed", gpu_like, steps=30, first=101, seed=40)
    alignment = curves.compare(resumed, refs)
    assert alignment.passed, alignment.summary()
    where = {v.statistic: v.where for v in alignment.verdicts}
    assert where["window-mean"] == "steps 105-114" and where["trend"] == "steps 101-110"
    shifted = curves.compare(make_run("shifted", lambda s: gpu_like(s) - 0.2, steps=30, first=101, seed=41), refs)
    assert {"window-mean"} <= {v.statistic for v in shifted.failures}
    # one-sided (curves.BETTER_SIDE): the same shift upward is a run that learned more, said, not failed
    better = curves.compare(make_run("better", lambda s: gpu_like(s) + 0.2, steps=30, first=101, seed=41), refs)
    window = next(v for v in better.verdicts if v.statistic == "window-mean")
    assert better.passed and window.passed and "(above: better)" in window.detail, better.summary()
    short = curves.compare(make_run("short", gpu_like, steps=8, first=101, seed=42), refs)
    window = next(v for v in short.verdicts if v.statistic == "window-mean")
    assert "logged steps 101-108: it cannot fill the window 105-114" in window.detail and window.passed is None


HOST = {"machine": "x86_64", "cpu": "Xeon", "isa": ["avx2", "avx512f", "fma"], "mask": None,
        "aten_capability": "AVX512", "env": {}, "torch": "2.13.0+cpu"}
AMX_HOST = {**HOST, "isa": ["amx_tile", "avx2", "avx512f", "fma"]}


def _nudged(run: Run, step_index: int, delta: float) -> Run:
    values = list(run[REWARD].values)
    values[step_index] += delta
    return dataclasses.replace(run, series={REWARD: Series(run[REWARD].steps, tuple(values))})


def test_same_seed_runs_compare_exactly_on_the_same_kernels():
    runs = [make_run(f"lab-s{i}", gpu_like, seed=i, extra={"host": HOST}) for i in range(3)]
    golden = Baseline.from_runs(runs, (REWARD,))
    assert golden.provenance["host"] == HOST
    again = make_run("lab-s1-again", gpu_like, seed=1, extra={"host": HOST})  # deterministic per seed
    alignment = curves.compare_exact(again, golden)
    assert alignment.passed and "bit for bit: same CPU kernels" in alignment.message()
    (verdict,) = curves.compare_exact(_nudged(again, 6, 1e-12), golden).failures
    assert verdict.where == "step 7" and "1 of 30 steps differ from lab-s1 (exactly)" in verdict.detail
    with pytest.raises(BadInput, match="no run of seed 9"):
        curves.compare_exact(make_run("other", gpu_like, seed=9), golden)


def test_same_seed_on_other_kernels_compares_within_ulps_and_says_so():
    """An AMX host (or a golden that records no host) reproduces a golden to ~1e-7, not bit for bit: judged within
    the cross-host tolerance, named in the verdict; a real divergence still fails."""
    golden = Baseline.from_runs([make_run(f"lab-s{i}", gpu_like, seed=i, extra={"host": HOST}) for i in range(3)],
                                (REWARD,))
    other = make_run("lab-s1-amx", gpu_like, seed=1, extra={"host": AMX_HOST})
    alignment = curves.compare_exact(_nudged(other, 0, 3e-8), golden)
    assert alignment.passed, alignment.message()
    assert "not bit for bit" in alignment.message() and "isa +amx_tile" in alignment.message()
    unknown = curves.compare_exact(_nudged(make_run("lab-s1-old", gpu_like, seed=1), 0, 3e-8), golden)
    assert unknown.passed and "host fingerprint unknown" in unknown.message()
    (verdict,) = curves.compare_exact(_nudged(other, 3, 1e-3), golden).failures  # a token flipped: a real change
    assert verdict.where == "step 4" and "within rtol 1e-05 / atol 1e-06" in verdict.detail


def _probs_run(name, level, seed, precision):
    return make_run(name, lambda s: level, noise=level * 0.02, seed=seed, metric=ROLLOUT_PROBS_DIFF,
                    extra={"precision": precision})


def test_rollout_probs_diff_floors_and_limits_follow_the_precision():
    # a healthy bf16 Ascend run logs ~4.4e-3: the size of the fp32 lab's stale-weights fault
    bf16 = Baseline.from_runs([_probs_run(f"npu{i}", 4.4e-3, i, "bf16") for i in range(3)], (ROLLOUT_PROBS_DIFF,))
    assert bf16.precision == "bf16"
    assert curves.compare(_probs_run("npu-new", 4.4e-3, 10, "bf16"), bf16).passed
    fp32 = Baseline.from_runs([_probs_run(f"lab{i}", 1e-7, i, "fp32") for i in range(3)], (ROLLOUT_PROBS_DIFF,))
    stale = curves.compare(_probs_run("stale", 4.4e-3, 11, "fp32"), fp32)
    assert {(v.statistic) for v in stale.failures} >= {"band", "sanity"}, stale.summary()
    assert default_tolerance(ROLLOUT_PROBS_DIFF, "fp32").band_atol < 4.4e-3 < default_tolerance(
        ROLLOUT_PROBS_DIFF, "bf16").band_atol * 10
    mixed = curves.compare(_probs_run("npu", 4.4e-3, 12, "bf16"), fp32)
    assert any("precision bf16 differs from the baseline's fp32" in n for n in mixed.notes)


def test_a_lab_option_the_golden_predates_is_named():
    """A lab run with an option the golden's config never held (a graded reward, --format-credit, against the lab
    golden recorded before the option) is told its recipe differs; one at the option's default is not, and a golden
    that holds the option names it as before."""
    from fixtures.dapo import TINY_LAB_GOLDEN

    golden = load_baseline(TINY_LAB_GOLDEN)
    run = golden.as_runs()[0]
    before = {k: v for k, v in golden.provenance["config"].items() if k != "format_credit"}  # the old golden's

    def with_lab(**lab):
        return dataclasses.replace(run, meta=dataclasses.replace(run.meta, extra={**run.meta.extra, "lab": {
            **before, "seed": 9, "steps": 30, **lab}}))

    old = dataclasses.replace(golden, provenance={**golden.provenance, "config": before})
    (note,) = [n for n in curves.compare(with_lab(format_credit=0.5), old).notes if "config differs" in n]
    assert "format_credit 0.5 vs 'unset'" in note, note
    assert not [n for n in curves.compare(with_lab(format_credit=0.5), golden).notes if "config differs" in n]
    (note,) = [n for n in curves.compare(with_lab(format_credit=0.0), golden).notes if "config differs" in n]
    assert "format_credit 0.0 vs 0.5" in note and "seed" not in note, note  # math_dapo's score, the old recipe


def test_a_sanity_limit_every_golden_run_breaks_is_left_to_the_band():
    """A recipe whose clean runs sit outside a sanity limit (seed 002's rollout top_p 0.9: rollout_probs_diff ~0.05 in
    fp32) is judged by its golden's band there, not failed on every night; a golden inside the limit keeps it
    (seeded: a stale candidate against a clean golden still fails on sanity)."""
    truncated = Baseline.from_runs([_probs_run(f"top_p{i}", 0.05, i, "fp32") for i in range(3)],
                                   (ROLLOUT_PROBS_DIFF,))
    same = curves.compare(_probs_run("night", 0.05, 7, "fp32"), truncated)
    (limit,) = [v for v in same.verdicts if v.statistic == "sanity"]
    assert limit.passed is None and "every golden run breaks [0, 0.001] too" in limit.detail and same.passed, \
        same.summary()
    clean = Baseline.from_runs([_probs_run(f"lab{i}", 1e-7, i, "fp32") for i in range(3)], (ROLLOUT_PROBS_DIFF,))
    stale = curves.compare(_probs_run("stale", 0.05, 7, "fp32"), clean)
    assert any(v.statistic == "sanity" and v.passed is False for v in stale.verdicts), stale.summary()


def test_sanity_limits_need_no_baseline():
    healthy = _probs_run("bf16", 4.4e-3, 1, "bf16")
    assert all(v.passed for v in curves.check_sanity(healthy))
    (limit,) = curves.check_sanity(_probs_run("bf16-garbled", 0.2, 1, "bf16"))
    assert limit.passed is False and "outside [0, 0.05]" in limit.detail and "NeMo-RL" in limit.detail
    (reward,) = curves.check_sanity(make_run("odd", lambda s: 1.5, noise=0.0))
    assert reward.passed is False and "DAPO reward range" in reward.detail


def test_baseline_roundtrip_refuses_overwrite_and_unknown_versions(gpu_baseline, tmp_path):
    path = gpu_baseline.save(tmp_path / "golden.json")
    loaded = load_baseline(path)
    ref = loaded.metrics[REWARD]
    assert ref.steps == tuple(range(1, 31)) and ref.n_runs == 5 and [r.seed for r in ref.runs] == [0, 1, 2, 3, 4]
    assert ref.center == pytest.approx(gpu_baseline.metrics[REWARD].center)
    assert [ref.half_width(i) for i in range(30)] == pytest.approx(
        [gpu_baseline.metrics[REWARD].half_width(i) for i in range(30)])
    doc = json.loads(path.read_text())
    assert {"start_step", "end_step", "step_interval", "values", "runs"} <= set(doc["metrics"][REWARD])  # Megatron
    assert doc["provenance"]["hardware"] == "cpu" and doc["provenance"]["date"]
    with pytest.raises(BadInput, match="already exists; pass --force"):
        gpu_baseline.save(path)
    for version in (1, SCHEMA_VERSION + 1):  # version 1 (mean/std bands) is refused too: re-record it
        path.write_text(json.dumps({**doc, "schema_version": version}))
        with pytest.raises(BadInput, match=f"schema_version {version} is not supported.*re-record"):
            load_baseline(path)


def _mutate(doc, how):
    metric = doc["metrics"][REWARD]
    if how == "n_runs 0":
        metric["n_runs"] = 0
    elif how == "n_runs negative":
        metric["n_runs"] = -3
    elif how == "metrics as a list":
        doc["metrics"] = [metric]
    elif how == "tolerance as strings":
        metric["tolerance"]["band_atol"] = "0.1"
    elif how == "all-null series":
        for run in metric["runs"]:
            run["values"] = [None] * len(run["values"])
    elif how == "window of one step":
        metric["tolerance"]["window"] = [5]
    elif how == "max_outliers 5.0":
        metric["tolerance"]["max_outliers"] = 5.0
    elif how == "NaN value":
        metric["runs"][0]["values"][3] = float("nan")
    elif how == "values edited":
        metric["values"][3] += 0.5
    elif how == "confidence 1":
        metric["tolerance"]["confidence"] = 1
    elif how == "unknown tolerance key":
        metric["tolerance"]["band_k"] = 4.0
    return doc


@pytest.mark.parametrize("how", ["n_runs 0", "n_runs negative", "metrics as a list", "tolerance as strings",
                                 "all-null series", "window of one step", "max_outliers 5.0", "NaN value",
                                 "values edited", "confidence 1", "unknown tolerance key"])
def test_malformed_golden_is_one_line_exit_2(gpu_baseline, tmp_path, capsys, how):
    path = tmp_path / "golden.json"
    doc = _mutate(gpu_baseline.to_json(), how)
    path.write_text(json.dumps(doc))  # json.dumps writes NaN as the NaN token Python's json reads back
    with pytest.raises(BadInput, match="golden.json"):
        load_baseline(path)
    run = tmp_path / "run.jsonl"
    _write_filelogger(run, make_run("run", gpu_like, seed=3))
    assert cli_main(["compare", str(run), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "golden.json" in err[0], err


def _write_filelogger(path, run: Run):
    lines = [json.dumps({"step": s, "data": {m: run[m].as_dict()[s] for m in run.series if s in run[m].as_dict()}})
             for s in run.steps]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_cli_compare_and_record_exit_codes(tmp_path, capsys):
    refs = [_write_filelogger(tmp_path / f"gpu{i}.jsonl", make_run(f"gpu{i}", gpu_like, seed=i)) for i in range(3)]
    good = _write_filelogger(tmp_path / "good.jsonl", make_run("good", gpu_like, seed=50))
    bad = _write_filelogger(tmp_path / "npu.jsonl", make_run("npu", npu_after_two_fixes, seed=51))
    golden = str(tmp_path / "golden.json")
    assert cli_main(["baseline", "record", *refs, "--out", golden]) == 0
    assert "self-check (leave-one-out): 0 of 3 runs flagged" in capsys.readouterr().out
    assert cli_main(["baseline", "record", *refs, "--out", golden]) == 2  # no overwrite without --force
    assert "--force" in capsys.readouterr().err
    assert cli_main(["compare", good, golden]) == 0
    assert "good vs golden: ALIGNED" in capsys.readouterr().out
    assert cli_main(["compare", bad, *refs, "--json", "--plot", str(tmp_path / "cmp.png")]) == 1
    out = json.loads(capsys.readouterr().out)
    # with 3 runs the slope rests on 3 values (t with 2 df): the band and the window catch seed 001's gap
    assert out["state"] == "MISALIGNED" and out["passed"] is False and "ok" not in out and "aligned" not in out
    assert any(v["statistic"] == "window-mean" and v["passed"] is False for v in out["verdicts"])
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["compare", good, refs[0]]) == 0  # one reference run: judged by its noise, and passes
    assert "good vs gpu0: ALIGNED" in capsys.readouterr().out
    assert cli_main(["compare", bad, refs[0], "--json"]) == 1  # ... and seed 001's case fails one-vs-one
    assert json.loads(capsys.readouterr().out)["passed"] is False
    assert cli_main(["compare", good]) == 0  # no baseline: the sanity limits only
    assert "vs sanity limits: ALIGNED" in capsys.readouterr().out
    for argv in (["compare", str(tmp_path / "missing.jsonl"), golden],
                 ["compare", golden, golden],  # a golden cannot be the candidate
                 ["compare", good, golden, "--metric", "actor/nope"],
                 ["compare", good, golden, "--plot", str(tmp_path)],  # onto a directory
                 ["compare", good, golden, "--plot", str(tmp_path / "no" / "cmp.png")],
                 ["baseline", "record", *refs, "--out", str(tmp_path)],
                 ["baseline", "record", *refs, "--out", str(tmp_path / "missing-dir" / "g.json")]):
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (argv, err)


def test_record_refuses_a_reference_that_disagrees_and_nan_runs(tmp_path, capsys):
    refs = [_write_filelogger(tmp_path / f"r{i}.jsonl", make_run(f"r{i}", gpu_like, seed=i)) for i in range(4)]
    odd = _write_filelogger(tmp_path / "odd.jsonl", make_run("odd", npu_after_two_fixes, seed=8))
    golden = tmp_path / "golden.json"
    assert cli_main(["baseline", "record", *refs, odd, "--out", str(golden)]) == 2
    err = capsys.readouterr().err
    assert "reference run odd disagrees with the other 4" in err and "--keep-flagged" in err and not golden.exists()
    assert cli_main(["baseline", "record", *refs, odd, "--out", str(golden), "--keep-flagged"]) == 0
    check = json.loads(golden.read_text())["provenance"]["self_check"]
    assert [f["run"] for f in check["flagged"]] == ["odd"] and check["false_alarm_rate"] == pytest.approx(0.2)
    capsys.readouterr()
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"step": 1, "data": {"critic/rewards/mean": 0.1}}\n{"step": 2, "data": {"critic/rewards/mean": '
                   'null}}\n')
    assert cli_main(["baseline", "record", *refs, str(nan), "--out", str(tmp_path / "g2.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "critic/rewards/mean is nan at step 2" in err[0]
    assert "diverged run cannot be a reference" in err[0]


def test_plot_puts_failures_first_and_survives_mathtext_names(tmp_path):
    weird = "$\\undefinedcmd$/loss"  # matplotlib would parse $...$ as mathtext and raise
    refs = [make_run(f"r{i}", gpu_like, seed=i, metric=weird) for i in range(3)]
    refs = [dataclasses.replace(r, series={**r.series, REWARD: make_run("x", gpu_like, seed=i).series[REWARD]})
            for i, r in enumerate(refs)]
    golden = Baseline.from_runs(refs, (REWARD, weird), {weird: CurveTolerance(band_atol=0.1)})
    cand = make_run("cand", npu_after_two_fixes, seed=5)
    cand = dataclasses.replace(cand, series={**cand.series, weird: make_run("w", gpu_like, seed=6).series[REWARD]})
    alignment = curves.compare(cand, golden, (weird, REWARD))
    png = curves.plot(alignment, cand, golden, tmp_path / "cmp.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = curves.band_series(cand, golden, (weird, REWARD), alignment)
    assert data[REWARD]["verdict"].startswith("FAIL") and data[weird]["verdict"] == "ok"
    assert data[REWARD]["candidate_name"] == "cand" and data[REWARD]["outside_steps"]
    assert data[REWARD]["baseline_name"].endswith("(3 runs)")


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
    # a spike limit, or none judged (a share's): the one tolerance field that takes "none"
    for value, limit in (("50", 50.0), ("none", None)):
        assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                         "--tolerance", f"{metric}:spike_limit={value}"]) == 0
        assert load_baseline(golden).metrics[metric].tolerance.spike_limit == limit
    assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                     "--tolerance", f"{metric}:band_atol=none"]) == 2
    # the window: the logged steps its statistic covers (a long recipe learns after the nightly's 5-14)
    assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                     "--tolerance", f"{metric}:window=6-12"]) == 0
    assert load_baseline(golden).metrics[metric].tolerance.window == (6, 12)
    for bad in ("12-6", "6", "6.5-12", "0-12", "-3-5", "1e1-12"):
        capsys.readouterr()
        assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                         "--tolerance", f"{metric}:window={bad}"]) == 2
        err = capsys.readouterr().err
        assert f"{metric}:window={bad}" in err and len(err.strip().splitlines()) == 1, err
    # a window past the runs (30 steps) would judge nothing: refused, naming a run, and the golden is left as it was
    before = golden.read_bytes()
    assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force",
                     "--tolerance", f"{metric}:window=21-31"]) == 2
    err = capsys.readouterr().err
    assert "window=21-31: run gpu0 logs critic/rewards/mean at fewer steps than the window's last" in err, err
    assert len(err.strip().splitlines()) == 1 and golden.read_bytes() == before
    # a recipe's calibration (scripts/calibrate-curves --out) sets the inflation of the metrics it calibrated, as the
    # tiny goldens are made; --tolerance wins over it; a file without a usable "inflation" is one line naming it
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"inflation": {metric: [2.6, 4.4, 2.4]}}))
    assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force", "--calibration",
                     str(calibration), "--tolerance", f"{metric}:trend_inflation=3"]) == 0
    tolerances = {m: b.tolerance for m, b in load_baseline(golden).metrics.items()}
    assert tolerances[metric].inflation == (2.6, 4.4, 3.0)
    assert tolerances[metric].band_atol == default_tolerance(metric).band_atol  # only the inflation is calibrated
    for bad in ({"inflation": {metric: [0.5, 1, 1]}}, {"inflation": {"no/such": [1, 1, 1]}}, [1]):
        calibration.write_text(json.dumps(bad))
        capsys.readouterr()
        assert cli_main(["baseline", "record", *refs, "--out", str(golden), "--force", "--calibration",
                         str(calibration)]) == 2
        err = capsys.readouterr().err
        assert f"--calibration {calibration}: needs" in err and len(err.strip().splitlines()) == 1, err


def test_a_verl_nightly_summary_is_judged_not_just_reported(tmp_path):
    """verl's Ascend nightly baseline (one mean of steps 5-14 per metric) judges as the nightly does (|d reward| <=
    0.05, widened by the candidate's own step noise): a clearly worse run fails, a matching one passes. The seeded
    bug is the old floors-only verdict, which never failed against a summary."""
    from harness.metrics.ingest import load_summary

    path = tmp_path / "baseline_dapo_npu.txt"
    path.write_text("critic/rewards/mean: -0.62\n")
    summary = load_summary(path)
    level = lambda value: lambda s: value  # noqa: E731
    same = curves.compare_summary(make_run("same", level(-0.63), noise=0.02, seed=1), summary)
    worse = curves.compare_summary(make_run("worse", level(-0.78), noise=0.02, seed=1), summary)
    assert same.passed, same.message()
    assert not worse.passed and worse.failures[0].statistic == "window-mean", worse.message()
    assert "judged by verl's nightly tolerance" in worse.failures[0].detail


def _verl_config(**actor):
    return {"algorithm": {"adv_estimator": "grpo"}, "data": {"max_response_length": 4},
            "actor_rollout_ref": {"actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                            "loss_agg_mode": "token-mean", "optim": {"lr": 1e-3},
                                            "ppo_mini_batch_size": 4, **actor},
                                  "rollout": {"n": 8, "temperature": 1.0}}}


def test_a_run_of_another_algorithm_fails_on_its_config():
    """DAPO's clip-higher lost (0.28 -> 0.2) changes nothing a 12-step tiny run's curves can show; verl's resolved
    config (the run's Hydra directory) does, so the alignment names the setting. The same config passes."""
    golden = Baseline.from_runs([make_run(f"r{i}", gpu_like, seed=i, extra={"config": _verl_config()})
                                 for i in range(3)], (REWARD,))
    assert golden.provenance["algorithm"]["actor_rollout_ref.actor.clip_ratio_high"] == 0.28
    same = curves.compare(make_run("same", gpu_like, seed=9, extra={"config": _verl_config()}), golden)
    assert same.passed and any(v.statistic == "algorithm" and v.passed for v in same.verdicts)
    lost = curves.compare(make_run("lost", gpu_like, seed=9, extra={"config": _verl_config(clip_ratio_high=0.2)}),
                          golden)
    (verdict,) = lost.failures
    assert verdict.statistic == "algorithm" and "clip_ratio_high 0.2 vs the golden's 0.28" in verdict.detail
    unknown = curves.compare(make_run("log-only", gpu_like, seed=9), golden)  # no config recorded: not judged
    assert unknown.passed and not any(v.statistic == "algorithm" for v in unknown.verdicts)
    # one optimizer update a step where the golden's runs took two (issue 43: its KL is 0 throughout)
    halved = curves.compare(make_run("one-update", gpu_like, seed=9, extra={"config": _verl_config(
        ppo_mini_batch_size=8)}), golden)
    assert [v.detail for v in halved.failures if v.statistic == "algorithm"] == [
        "1 algorithm setting(s) differ from the golden's 9: actor_rollout_ref.actor.ppo_mini_batch_size 8 vs the "
        "golden's 4"]
    # a setting the golden's verl did not have and the candidate's has: the algorithm changed
    gained = curves.compare(make_run("gained", gpu_like, seed=9, extra={"config": _verl_config(
        policy_loss={"loss_mode": "gspo"})}), golden)
    assert [v.statistic for v in gained.failures] == ["algorithm"], gained.message()
    # a golden recorded before the batch keys were judged: they are not held against it
    older = dataclasses.replace(golden, provenance={**golden.provenance, "algorithm_keys": None, "algorithm": {
        k: v for k, v in golden.provenance["algorithm"].items() if not k.endswith("ppo_mini_batch_size")}})
    assert curves.compare(make_run("newer", gpu_like, seed=9, extra={"config": _verl_config()}), older).passed
    with pytest.raises(BadInput, match="train different algorithms"):
        other = _verl_config(loss_agg_mode="seq-mean-token-sum")
        Baseline.from_runs([make_run("a", gpu_like, extra={"config": _verl_config()}),
                            make_run("b", gpu_like, extra={"config": other})], (REWARD,))
