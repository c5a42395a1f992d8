"""Golden baselines for curve alignment: per metric, every reference run's curve (with its seed), the
tolerances, and provenance (hardware, precision, versions, date, source runs, the self-check).

Schema version 2 stores the per-run curves themselves; the centre, the pooled spread and the bands
(harness.metrics.stats) are derived from them when a golden is loaded, so the statistics can never drift from
the data, a same-seed run can be compared exactly (Megatron's deterministic test), and windows are placed where
the candidate's logged steps put them. "values" keeps Megatron's golden-values shape (start_step, end_step,
step_interval, values = the centre) for people and tools that read it; the loader checks it against the runs.

Several goldens coexist under baselines/<scale>/ (baselines/tiny/dapo_lab.json from the lab, a verl one beside
it); provenance names the source ("lab", "verl"), the precision and the runs' config.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import fractions
import itertools
import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property, reduce
from pathlib import Path

from harness.errors import BadInput
from harness.io import read_versioned, versioned, write_json_atomic
from harness.metrics import stats
from harness.metrics.keys import (
    ENTROPY,
    GRAD_NORM,
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    PG_LOSS,
    RESPONSE_CLIP_RATIO,
    RESPONSE_LENGTH,
    REWARD,
    ROLLOUT_PROBS_DIFF,
)
from harness.metrics.run import Run, RunMeta, Series
from harness.numeric import MAX_STEP, METRIC_LIMIT, is_metric_value

SCHEMA = "ascend-rl-harness/baseline"
# 3: + "constants" (the per-step values of the metrics every reference run logs alike) and "power" (the MDE table),
# and optionally "moving" (the metrics its runs move, with their longest stretch at one value, the most steps a run
# held one value and the median run's: find_moving; a golden without it checks none, one without the count judges
# stretches only, one without the median judges the clip fraction's rests against twice the most);
# 2: per-run curves + derived robust/pooled Student-t bands (1: per-step mean/std, k*std). Version 2 is still read:
# its bands are the same, it only lacks the constants (a compare says so: CONSTANTS_MISSING) and the power table.
SCHEMA_VERSION = 3
READABLE_VERSIONS = (2, 3)
CONSTANTS_MISSING = ("note: this golden is schema 2: it stores no constant metrics (settings, schedules, budgets the "
                     "trainer logs), so none was checked; re-record it with `ascend-rl-harness baseline record` "
                     "(schema 3) to check them")


def _number(doc: dict, key: str, where: str, *, low: float = 0.0, high: float = METRIC_LIMIT, integer: bool = False,
            low_open: bool = False, high_open: bool = False):
    """doc[key] validated as a finite number (not a bool or string) in its range; BadInput naming it."""
    value = doc[key]
    kinds = (int,) if integer else (int, float)
    ok = type(value) in kinds and _finite(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise BadInput(f"{where}: tolerance {key} is {value!r}; it must be a{'n integer' if integer else ' number'} "
                       f"in {bounds}")
    return value


def _finite(value) -> bool:
    """Within harness.numeric's metric range: 1e308 values overflowed the band's sums and squares."""
    return is_metric_value(value)


@dataclass(frozen=True)
class CurveTolerance:
    """How far a candidate may sit from the reference, per statistic (data, not code).

    band: per-step half-width = max(band_atol, band_rtol*|centre|, Student-t prediction half-width at
      `confidence` from the spread pooled over `pool` neighbouring steps each side); up to `max_outliers`
      (fraction of compared steps, at least one step) may fall outside (Megatron).
    window: `window_stat` of the window[0]-th..window[1]-th logged steps (counted from the candidate's first
      logged step, so a run resumed at step 101 is judged on 105-114) within max(window_atol,
      window_rtol*|ref|, prediction half-width of the runs' window statistics) (verl Ascend nightly: mean of steps
      5-14, |d reward| <= 0.05).
    trend: least-squares slope over the first `trend_steps` logged steps within max(trend_atol, prediction
      half-width of the runs' slopes).
    """

    band_atol: float
    band_rtol: float = 0.0
    # Per statistic. Measured on the tiny lab (scripts/measure-false-alarms, 24 clean seeds, 1,500 random 3-run
    # baselines): 0.99 / 10 % outliers flagged 16 % of clean runs, 0.998 / 20 % flags ~2 %. Clean RL seeds
    # sometimes take another mode for a stretch of steps (one lab seed's response length sits 0.8 below the
    # others for 7 steps): the band allows that stretch, the window and trend still see a sustained shift.
    confidence: float = 0.998
    max_outliers: float = 0.2
    pool: int = 2
    window: tuple[int, int] = (5, 14)
    window_stat: str = "mean"
    window_atol: float = 0.05
    window_rtol: float = 0.0
    trend_steps: int = 10
    trend_atol: float = 0.01
    # How much wider than the noise model (harness.metrics.stats.run_noise) runs of other seeds spread, per
    # statistic: measured on calibration seeds (scripts/calibrate-curves; NOISE_INFLATION below).
    band_inflation: float = 1.0
    window_inflation: float = 1.0
    trend_inflation: float = 1.0
    # How large one step may stand out, x the metric's level, before it fails alone (harness.metrics.curves.spikes):
    # a broken update spikes by orders of magnitude (NeMo-RL: 1e6-3e9), a clean RL run 3-10x its median (issue 31).
    # The gradient norm's is wider (DEFAULT_TOLERANCES). None: one-step excursions are not events at all -- not
    # found, replaced or counted -- for a share that bursts on clean seeds: a clip fraction near 0 clips 5x more
    # tokens for a step here and there, more often in some seeds than others (one clean seed of the warm-started lab
    # burst 5 times in 28 steps against none in its golden's 59: the 2-seed goldens it met flagged it on that alone).
    # Its bursts are steps like any other, in its band, window and trend.
    spike_limit: float | None = stats.SPIKE_SIZE_LIMIT
    # The update's clip fraction only (is_update_clip): the share of the reward window's logged steps at 0 that fails
    # (stuck_limit), as the recipe's calibration measured it (fit_clip_rest_share); None: CLIP_REST_SHARE, the prior.
    # Above 1 it never fails: a recipe whose clean runs clip nothing at most steps.
    rest_share: float | None = None

    def __post_init__(self):
        self.validate(dataclasses.asdict(self), "tolerance")

    @staticmethod
    def validate(doc: dict, where: str) -> None:
        for key in ("band_atol", "band_rtol", "window_atol", "window_rtol", "trend_atol"):
            _number(doc, key, where)
        for key in ("band_inflation", "window_inflation", "trend_inflation"):
            _number(doc, key, where, low=1.0, high=1e3)
        # max_outliers is a fraction of the steps: 5.0 would allow every step outside (MISALIGNED read as ALIGNED)
        _number(doc, "max_outliers", where, high=1.0, high_open=True)
        _number(doc, "confidence", where, low=0.5, high=1.0, low_open=True, high_open=True)
        _number(doc, "pool", where, high=50, integer=True)
        _number(doc, "trend_steps", where, low=2, high=10_000, integer=True)
        window = doc["window"]
        if (not isinstance(window, (list, tuple)) or len(window) != 2 or any(type(w) is not int for w in window)
                or not 1 <= window[0] <= window[1] <= MAX_STEP):
            raise BadInput(f"{where}: tolerance window {window!r} must be [first, last] logged steps, "
                           "1 <= first <= last (verl's nightly: [5, 14])")
        if doc["spike_limit"] is not None:
            _number(doc, "spike_limit", where, low=1.0)
        if doc.get("rest_share") is not None:
            _number(doc, "rest_share", where, low=0.0, high=2.0, low_open=True)
        if doc["window_stat"] not in ("mean", "median"):
            raise BadInput(f"{where}: tolerance window_stat {doc['window_stat']!r}: use mean or median")

    @classmethod
    def from_json(cls, doc, where: str, metric: str = "") -> CurveTolerance:
        """A stored tolerance; a key it lacks takes the field's default, and `spike_limit` the metric's own
        (DEFAULT_TOLERANCES: a gradient norm recorded before the field keeps its wider limit). A golden of the one
        release that stored `"spikes": true|false` instead reads as the metric's limit, or as None."""
        if not isinstance(doc, dict):
            raise BadInput(f"{where}: tolerance must be an object, got {type(doc).__name__}")
        doc = dict(doc)
        known_metric = DEFAULT_TOLERANCES.get(metric) or EXTRA_TOLERANCES.get(metric)
        limit = known_metric.spike_limit if known_metric else stats.SPIKE_SIZE_LIMIT
        if "spikes" in doc and "spike_limit" not in doc:
            judged = doc.pop("spikes")
            if type(judged) is not bool:
                raise BadInput(f"{where}: tolerance spikes {judged!r}: use true or false")
            doc["spike_limit"] = (limit or stats.SPIKE_SIZE_LIMIT) if judged else None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown or "band_atol" not in doc:
            raise BadInput(f"{where}: tolerance keys {unknown or ['band_atol (missing)']} are not "
                           f"{', '.join(sorted(known))}")
        full = {**{f.name: f.default for f in dataclasses.fields(cls) if f.name != "band_atol"},
                "spike_limit": limit, **doc}
        cls.validate(full, where)
        return cls(**{**full, "window": tuple(full["window"])})

    def to_json(self) -> dict:
        doc = {**dataclasses.asdict(self), "window": list(self.window)}
        if self.rest_share is None:  # a golden without it reads as before, in a harness that predates the field too
            del doc["rest_share"]
        return doc

    @property
    def inflation(self) -> tuple[float, float, float]:
        """(band, window, trend) noise inflation (INFLATED_STATISTICS' order)."""
        return self.band_inflation, self.window_inflation, self.trend_inflation

    def with_inflation(self, factors) -> CurveTolerance:
        """The same tolerance with another (band, window, trend) noise inflation."""
        band, window, trend = factors
        return dataclasses.replace(self, band_inflation=band, window_inflation=window, trend_inflation=trend)


# rollout_probs_diff_mean (mean |p_rollout - p_actor| of the sampled tokens) is float noise on a healthy run, and
# float noise depends on the precision: ~1e-7 in the fp32 lab, ~4.4e-3 on a healthy bf16 NPU run -- as large as
# the fp32 lab's stale-weights fault. One floor for both either flags every healthy bf16 run or misses the lab's
# faults, so the floors follow the baseline's precision. bf16/fp16: verl's Ascend nightly allows 5 % relative.
_PROBS_DIFF_BF16 = CurveTolerance(band_atol=2e-3, band_rtol=0.05, window_atol=1e-3, window_rtol=0.05, trend_atol=2e-4)
PRECISION_TOLERANCES: dict[str, dict[str, CurveTolerance]] = {
    "fp32": {ROLLOUT_PROBS_DIFF: CurveTolerance(band_atol=1e-4, band_rtol=0.05, window_atol=5e-5, window_rtol=0.05,
                                                trend_atol=1e-5)},
    "bf16": {ROLLOUT_PROBS_DIFF: _PROBS_DIFF_BF16},
    "fp16": {ROLLOUT_PROBS_DIFF: _PROBS_DIFF_BF16},
}
PRECISIONS = tuple(PRECISION_TOLERANCES)

# Defaults per metric (used by `baseline record` and when comparing against raw runs). Reward: verl's
# nightly |d| <= 0.05 on the windowed mean. rollout_probs_diff: the bf16 floors unless the precision is known.
DEFAULT_TOLERANCES: dict[str, CurveTolerance] = {
    REWARD: CurveTolerance(band_atol=0.1, window_atol=0.05, trend_atol=0.01),
    RESPONSE_LENGTH: CurveTolerance(band_atol=0.5, band_rtol=0.1, window_atol=0.25, window_rtol=0.05,
                                    trend_atol=0.05),
    PG_LOSS: CurveTolerance(band_atol=0.1, window_atol=0.05, trend_atol=0.01),
    # verl logs the gradient norm before clipping (actor.grad_clip bounds the update it feeds): clean warm-started lab
    # runs spiked to 51x (--init-seed 0, warm start 150; one of 20 seeds) and 239x (gbs 32, warm start 150; one of
    # 40), and a 20x limit flagged 9 of 90 clean one-run comparisons on one such seed. Its limit sits at the geometric
    # middle of the largest clean spike seen (239x) and the smallest NeMo-RL reports from MoE runs without routing
    # replay (1e6x).
    GRAD_NORM: CurveTolerance(band_atol=0.5, band_rtol=0.3, window_atol=0.25, window_rtol=0.15, trend_atol=0.1,
                              spike_limit=1e4),
    ROLLOUT_PROBS_DIFF: _PROBS_DIFF_BF16,
}
ALIGN_METRICS = tuple(DEFAULT_TOLERANCES)
# Judged too where the golden's runs log them (issue 43: the verdict read 5 of the ~91 numbers verl logs): the
# entropy, the clip fractions and the truncation rate verl's own nightly and
# NeMo-RL's test suites check. Judged in one family with the five (FAMILY_ALPHA), so they add statistics, not alarms.
# Floors: a few percent of the lab's levels (clip fractions ~0.1-0.3).
EXTRA_TOLERANCES: dict[str, CurveTolerance] = {
    ENTROPY: CurveTolerance(band_atol=0.05, band_rtol=0.1, window_atol=0.02, window_rtol=0.05, trend_atol=0.005),
    PG_CLIPFRAC: CurveTolerance(band_atol=0.02, window_atol=0.01, trend_atol=0.002, spike_limit=None),
    PG_CLIPFRAC_LOWER: CurveTolerance(band_atol=0.02, window_atol=0.01, trend_atol=0.002, spike_limit=None),
    RESPONSE_CLIP_RATIO: CurveTolerance(band_atol=0.05, window_atol=0.02, trend_atol=0.005, spike_limit=None),
}
# Not actor/ppo_kl: heavy-tailed in the lab, its spikes (events, judged against the golden's rate) flagged 5 of 72
# clean held-out candidates at N=1 and 13 of 588 at N=3 (seeds 600-608), more than its statistics could catch. Not
# perf/total_num_tokens: it counts the batch DAPO trains on, 0 at a step whose groups all agreed (nothing to
# update): clean lab seed 3 has 7 such steps in 30, and its band flagged it against seeds 0-4 at recording.
FAMILY_METRICS = ALIGN_METRICS + tuple(EXTRA_TOLERANCES)
RUN_ONLY_LAB_KEYS = frozenset({"seed", "steps"})  # a lab golden's config leaves them out: its runs differ in them
# One false-alarm budget for every judged statistic (band, window, trend of each metric): what the five metrics' 15
# statistics spent at confidence 0.998 each. A comparison of m statistics judges each at alpha x FAMILY_ALPHA / (sum
# of the alphas): Bonferroni, whose any-failure event is Holm's (Holm's step-down fails the family iff its smallest
# p-value is below FAMILY_ALPHA / m; it differs only in how many more statistics it names once one has failed). So
# judging 30 or 60 metrics does not multiply alarms: each statistic gets a smaller share.
FAMILY_ALPHA = 15 * (1 - 0.998)


# How much wider than their step noise clean runs of other seeds spread, per metric and statistic (band, window,
# trend): a property of the recipe. These defaults are a golden's unless it says otherwise: the first calibration
# (the tiny lab's seeds 0-9, matched at the 0.9 quantile), kept as the prior for a recipe nobody calibrated because
# with it one or two reference runs still catch seed 001's 671B case (reward -0.88 -> -0.78 in 10 steps against the
# GPU run's -0.62; tests/test_curves.py). The tiny recipe's own clean seeds spread far more (they are bimodal:
# INFLATION_QUANTILES): scripts/calibrate-curves measures its inflation (baselines/tiny/curve_calibration.json) and
# writes it into the tiny goldens (--golden); a user's recipe gets its own the same way, or by `baseline record
# --tolerance METRIC:band_inflation=...`.
NOISE_INFLATION: dict[str, tuple[float, float, float]] = {
    REWARD: (2.0, 2.2, 1.4),
    RESPONSE_LENGTH: (3.7, 7.5, 5.4),  # the lab's lengths switch between modes for stretches of steps
    PG_LOSS: (1.4, 1.4, 1.7),
    # band 5.4 per step while its spikes counted as noise; now they are events (issue 31). Trend 1.7, the lab
    # calibration's, not 1.0: at 1.0 a slowly rising clean grad-norm (lab seed 202) carried most of the defaults'
    # false alarms, 5.3 % at one reference run (issue 43; baselines/tiny/lab_prior_measurement.json)
    GRAD_NORM: (2.3, 1.4, 1.7),
    ROLLOUT_PROBS_DIFF: (1.6, 1.7, 1.0),
}
INFLATED_STATISTICS = ("band", "window", "trend")
# The metrics nobody calibrated yet (EXTRA_TOLERANCES): the widest inflation any of the five needed, per statistic,
# so a new metric cannot raise the false alarms before scripts/calibrate-curves measures its own.
EXTRA_INFLATION = tuple(max(f[i] for f in NOISE_INFLATION.values()) for i in range(len(INFLATED_STATISTICS)))


def default_tolerance(metric: str, precision: str | None = None) -> CurveTolerance:
    """The metric's tolerance; rollout_probs_diff's floors follow the precision (bf16 when unknown: the
    production NPU precision, and the wider floor); the noise inflation is NOISE_INFLATION's."""
    if metric in PRECISION_TOLERANCES.get(precision or "bf16", {}):
        tol = PRECISION_TOLERANCES[precision or "bf16"][metric]
    elif metric in DEFAULT_TOLERANCES or metric in EXTRA_TOLERANCES:
        tol = DEFAULT_TOLERANCES.get(metric) or EXTRA_TOLERANCES[metric]
    else:
        raise BadInput(f"--metric {metric!r}: no default tolerance; known: {', '.join(FAMILY_METRICS)}")
    return tol.with_inflation(NOISE_INFLATION.get(metric, EXTRA_INFLATION))


# Quantiles of the standardized differences the inflation matches (scripts/calibrate-curves). Clean seeds of the
# tiny lab are bimodal within 14 steps: some find the task early (reward -0.9 -> 0), others stay near -0.95 with a
# rising grad-norm. Matched at the 0.9 quantile on 10 seeds the window's and trend's inflation fit the common path
# only, and held-out seeds false-alarmed 21 / 14 / 11 / 8 % at N = 1 / 2 / 3 / 5 (issue 31). Now every statistic is
# matched in the tail, on 100 calibration seeds (9,900 ordered pairs: ~50 beyond the 0.995 quantile). 0.995 was
# chosen over 0.99 inside the calibration seeds alone (calibrate on 0-49, judge 50-69: 3.7 / 2.7 / 3.1 / 3.2 % vs
# 4.2 / 2.8 / 3.2 / 3.4 %); the held-out seeds' rates are in baselines/tiny/curve_calibration.json.
INFLATION_QUANTILES = {"band": 0.995, "window": 0.995, "trend": 0.995}


def measure_inflation(runs: list[Run], metric: str, tol: CurveTolerance) -> dict[str, float]:
    """{band, window, trend}: the noise inflation that makes one reference run's verdict hold its stated rate on
    these runs. For every ordered pair (candidate, reference) of runs, each statistic's difference is divided by
    the SD the noise model gives it from the reference alone (harness.metrics.stats, times sqrt(2): one run on
    each side); the inflation is that ratio's INFLATION_QUANTILES quantile over the Student-t quantile the verdict
    would use there (at least 1). Matched on the verdict's own form, it also covers what the noise model leaves
    out: seeds that take other paths, runs whose noise differs from each other's, regime switches. Steps a run did
    not log (a step with nothing to update logs no loss) are left out."""
    raw = [r[metric] for r in runs if metric in r]
    if len(raw) < 3:
        raise BadInput(f"{metric}: measuring the noise inflation needs >= 3 runs that log it")
    # as the verdicts judge them: spikes replaced (they are judged as events), robust centres where the reference
    # run alone says the metric is heavy-tailed (what a 1-run golden decides from). Each run is despiked by its own
    # noise, not capped by each reference's bound (MetricBaseline.spike_diff_cap: 2.6x a 15-step run's, 1.9x a
    # 30-step one's): a burst the cap would remove then widens the inflation, never narrows it, and the committed
    # calibration stays what this code measures
    series = [despiked(s, tol)[0] for s in raw]
    heavy = {id(c): stats.heavy_tailed([r.values], spike_floor(tol)) for c, r in zip(series, raw, strict=True)}
    first_step = min(s.steps[0] for s in series)
    first, last = window_steps(first_step, tol)
    head = tuple(range(first_step, first_step + tol.trend_steps))
    ratios: dict[str, list[float]] = {"band": [], "window": [], "trend": []}
    noise_df = []
    for cand, ref in itertools.permutations(series, 2):
        noise = stats.pooled_noise([ref.values])
        if noise.sigma <= 0:
            continue
        noise_df.append(noise.df)
        rmap = ref.as_dict()
        ratios["band"] += [abs(v - rmap[t]) / (noise.sigma * math.sqrt(2))
                           for t, v in zip(cand.steps, cand.values, strict=True) if t in rmap]
        robust = heavy[id(ref)]
        wc = window_stat(cand, first, last, tol.window_stat, robust)
        wr = window_stat(ref, first, last, tol.window_stat, robust)
        if wc is not None and wr is not None:
            ratios["window"].append(abs(wc - wr) / (noise.mean_sd(last - first + 1) * math.sqrt(2)))
        hc, hr = cand.window(head[0], head[-1]), ref.window(head[0], head[-1])
        if hc.steps == head and hr.steps == head:
            ratios["trend"].append(abs(slope(hc, robust) - slope(hr, robust)) / (noise.slope_sd(head) * math.sqrt(2)))
    df = min(int(statistics.median(noise_df)), stats.MAX_PRIOR_DF) if noise_df else 1
    out = {}
    for key, values in ratios.items():
        q = INFLATION_QUANTILES[key]
        if len(values) < 2:
            out[key] = 1.0
            continue
        empirical = statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]
        out[key] = max(1.0, empirical / stats.t_quantile(df, q))
    return out


# Metrics every reference run logs alike (issue 43): verl logs ~91 numbers a step, and 30 of them are the same at
# every step of a clean tiny run -- the settings, schedules and budgets the trainer logs (actor/lr, a length cap,
# a clip ratio). One of them differed in a run whose reward stayed flat, and nothing compared it. Checking them costs
# no false alarm: a candidate must reproduce each to float tolerance, and the verdict names the first step that
# differs (harness.metrics.curves.constants).
CONSTANT_RTOL, CONSTANT_ATOL = 1e-6, 1e-9
# One run cannot tell a schedule from noise: a one-run golden keeps only metrics with one value at every step, over
# at least this many steps.
MIN_CONSTANT_STEPS = 3
# Never constants, however alike the golden's runs log them: a batch's extremes and DAPO's sampler counts sit at a
# bound (the reward's max at 1, the shortest response at 1 token, the kept groups at the batch size) on most steps
# of most seeds, not all. Kept as constants, one-run lab goldens (seeds 0-4, 600, 601) flagged 22 of 42 clean
# candidates on critic/rewards/max, response_length/min and train/kept_groups. A clip ratio (the share of responses
# or prompts cut at their length cap) is such a measurement too: 0 at every step of 5 of 20 clean seeds of the
# warm-started lab (--init-seed 0, warm start 150), above 0 somewhere in the rest; as a constant of one-run goldens,
# response_length_non_aborted/clip_ratio flagged 16 of 90 clean candidates (12 on it alone).
NOT_CONSTANT_SUFFIXES = ("/max", "/min", "/clip_ratio")
NOT_CONSTANT = ("train/num_gen_batches", "train/kept_groups")
# Nor the machine's measurements (verl's perf/* and timing_*): a host that logs one the same at every step (the
# memory a CPU run reports as 0, a synthetic log's throughput) says nothing of the job's settings.
NOT_CONSTANT_PREFIXES = ("perf/", "timing_s/", "timing_per_token_ms/")


def same_value(a: float, b: float) -> bool:
    """Equal to the constants' float tolerance (a setting logged through float32 and back)."""
    return math.isclose(a, b, rel_tol=CONSTANT_RTOL, abs_tol=CONSTANT_ATOL)


def jitters(values) -> bool:
    """Whether a series moves by float noise: two steps in a row that differ, but within the constants' tolerance. A
    setting or a schedule repeats its float exactly or moves by more; a measurement pinned at a bound jitters by
    ulps (the lab's rollout/actor probability correlation: 1.0, 0.99999994, ..., 0.99999887 on clean seeds of the
    gbs-32 recipe; kept as a constant, one-run goldens flagged 6 of 57 clean candidates on it)."""
    return any(a != b and same_value(a, b) for a, b in itertools.pairwise(values))


def may_be_constant(metric: str) -> bool:
    """Whether a metric may be a constant by its name: not a batch's extreme, a sampler count, a share cut at a cap
    or the machine's measurement (NOT_CONSTANT*)."""
    return not (metric in NOT_CONSTANT or metric.endswith(NOT_CONSTANT_SUFFIXES)
                or metric.startswith(NOT_CONSTANT_PREFIXES))


def find_constants(runs: list[Run], judged) -> dict[str, Series]:
    """metric -> its per-step values, for every metric outside `judged` that all runs log at the same steps with the
    same finite values (with one run: one value at every step), and that no run logs with float jitter."""
    out = {}
    for metric in sorted(runs[0].series):
        if metric in judged or not may_be_constant(metric) or not all(metric in r for r in runs):
            continue
        curves = [r[metric] for r in runs]
        ref = curves[0]
        values = [v for c in curves for v in c.values]
        if min(map(len, curves)) < MIN_CONSTANT_STEPS or not all(map(_finite, values)) or any(
                jitters(c.values) for c in curves):
            continue
        # one value everywhere (the actor's lr, logged only at steps that updated: the runs' steps may differ), or
        # a schedule: the same values at the same steps in every run (two runs at least)
        if all(same_value(v, values[0]) for v in values) or (len(runs) > 1 and all(
                c.steps == ref.steps and all(map(same_value, c.values, ref.values)) for c in curves[1:])):
            out[metric] = ref
    return out


# Metrics the golden's runs move (a continuous measurement: a KL, a loss, a gradient norm, a mean advantage): a
# candidate that holds one value far longer than any golden run did has a part of its trainer stuck, with no noise to
# hide in (issue 43: a frozen optimizer's actor/ppo_kl is 0 from the step it froze, a zeroed advantage's
# actor/pg_loss and actor/grad_norm exactly 0; the reward curves of the same runs sat inside the golden's bands). The
# golden stores each one's range and its runs' longest stretch at one value. A continuous metric may rest at one
# value: a lab seed near convergence trains one on-policy mini batch a step, its KL exactly 0 (on 120 clean 30-step
# lab seeds the longest rest was 1 step in 87, 2-4 in 29, 5-10 in 4). Before the stretch was stored, one golden run
# that logged a KL of 0 twice made the rule judge no KL at all: a frozen optimizer was caught by 54 % of 5-run lab
# goldens at `baseline record`'s defaults, and a collapsed clean seed's 9-step rest of its mean advantage at 0 was
# 4.5 points of one-run goldens' 9.5 % false alarms (docs/curves.md).
STUCK_STEPS = 5


# The share of the window's logged steps the update's clip fraction must rest at 0 at to fail (rest_bounds says why it
# counts): calibrated on the lab's calibration seeds 0-99, whose clean runs clipped nothing at 0-5 of steps 5-14 and
# two at 7; a beta-binomial fitted to those counts by moments puts a clean seed at 8 of 10 or more at 0.16 % (7: 0.6
# %; 7 of 8, a 12-step run's window, 0.11 %), and at STUCK_STEPS one-run goldens of those seeds flagged 2.6 % of the
# others on it (docs/curves.md, "The clip fraction's rests").
CLIP_REST_SHARE = fractions.Fraction(4, 5)  # exact: 8 of 10 steps, 7 of 8; the prior of a recipe that fits none
# A moving metric as a golden stores it (find_moving): lowest, highest, longest stretch at one value, the most steps of
# the window a run held one value at, and the median run's (None: the golden predates the count, or the median)
Moving = tuple[float, float, int, int | None, float | None]


def stuck_limit(longest: int, steps: int, clip_rests: bool = False, typical: float | None = None,
                share: float | None = None) -> int:
    """Steps at one value that fail a candidate judged on `steps` steps, against a golden whose runs held one value at
    most `longest` steps (in a row, or in the window: most_at_one_value): at least STUCK_STEPS (at 3 in a row the lab's
    clean seeds flagged 40 of 182 one-run comparisons), more than twice the golden's own rest, and more than a third of
    the steps (a clean 30-step lab seed rested its KL at 0 for 10 steps once it had learned the task, against goldens
    whose KL never rested).

    The update's clip fraction at 0 in the window (`clip_rests`: rest_bounds) fails from `share` of the window's
    logged steps (the recipe's calibrated CurveTolerance.rest_share; None: CLIP_REST_SHARE; at least STUCK_STEPS), and
    with the golden runs' median count (`typical`; None for a golden recorded before it: twice the most, as before) at
    more than twice the median run's and more than the most: its floor is the recipe's calibrated tail, and the most
    of more runs holds a slow seed more often, so twice the most made the count weaker as the golden grew (issue 43:
    lab damped-updates caught by 64 / 55 / 47 / 38 / 24 % of goldens of 1 / 2 / 3 / 5 / 10 runs on the count alone,
    with the median 64 / 69 / 69 / 71 / 75 %; no false alarm either way on the lab's or verl's clean seeds)."""
    if not clip_rests:
        return max(STUCK_STEPS, 2 * longest + 1, steps // 3 + 1)
    golden = 2 * longest + 1 if typical is None else max(math.floor(2 * typical) + 1, longest + 1)
    floor = CLIP_REST_SHARE if share is None else fractions.Fraction(share).limit_denominator(1000)  # 0.6 x 10 is 6
    return max(STUCK_STEPS, math.ceil(floor * steps), golden, steps // 3 + 1)


# The tail a calibrated clip-rest floor leaves a clean run in (fit_clip_rest_share): CLIP_REST_SHARE's, chosen at 0.16
# % (7 of 10 would have been 0.6 %), which is the 1 - 0.998 each statistic was judged at before FAMILY_ALPHA shared
# one budget (CurveTolerance.confidence)
CLIP_REST_TAIL = 0.002
# Fewer clean runs say little of a recipe's tail: their fit keeps the prior (CLIP_REST_SHARE)
CLIP_REST_MIN_RUNS = 10


def _beta_binomial_tail(k: int, n: int, p: float, rho: float) -> float:
    """P(X >= k) for X ~ beta-binomial(n) of mean n p and intra-class correlation `rho` (binomial at rho <= 0)."""
    if rho <= 0.0:
        return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))
    a, b = p * (1 / rho - 1), (1 - p) * (1 / rho - 1)

    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    return sum(math.exp(math.log(math.comb(n, j)) + log_beta(j + a, n - j + b) - log_beta(a, b))
               for j in range(k, n + 1))


def fit_clip_rest_share(counts: list[int], steps: int) -> fractions.Fraction | None:
    """The recipe's clip-rest floor (CurveTolerance.rest_share) from clean calibration runs' counts of the reward
    window's `steps` logged steps their update's clip fraction rested at 0 (clip_rest_count): the smallest count, at
    least STUCK_STEPS, that a beta-binomial fitted to them by moments (seeds differ in how often they clip nothing: the
    lab's are over-dispersed, rho 0.09) leaves a clean run at or above with probability CLIP_REST_TAIL at most, over
    `steps`; above 1 where none does (the count then never fails). None under CLIP_REST_MIN_RUNS runs. The lab's
    recipe before 2026-12-08 fit 8 of 10 on its seeds 0-99 (rho 0.09), CLIP_REST_SHARE; the graded lab fits 6 (rho
    0.03). Issue 43: a recipe whose clean runs clip nothing at a third of the window's steps or more false-alarmed 2-11
    % at one reference run against that floor, and could not fit its own."""
    if len(counts) < CLIP_REST_MIN_RUNS or not all(0 <= c <= steps for c in counts) or steps < STUCK_STEPS:
        return None
    mean, var = statistics.fmean(counts), statistics.variance(counts)
    p = mean / steps
    if p <= 0.0:  # no clean run ever clipped nothing here: the least count the rule takes
        return fractions.Fraction(STUCK_STEPS, steps)
    if p >= 1.0:  # every clean run clipped nothing at every step (one on-policy mini batch a step): never fails
        return fractions.Fraction(steps + 1, steps)
    rho = min((var / (steps * p * (1 - p)) - 1) / (steps - 1), 1.0 - 1e-9)
    for k in range(STUCK_STEPS, steps + 1):
        if _beta_binomial_tail(k, steps, p, rho) <= CLIP_REST_TAIL:
            return fractions.Fraction(k, steps)
    return fractions.Fraction(steps + 1, steps)


def clip_rest_count(run: Run, metric: str, rest: CurveTolerance) -> tuple[int, int] | None:
    """(steps at 0, steps logged) of `metric`, the update's clip fraction, in `rest`'s window (rest_tolerance) of
    `run`: what fit_clip_rest_share reads, counted as curves.stuck counts a candidate's (to float rounding at a share's
    scale, stretch_tolerance). None where the run logs it at fewer than STUCK_STEPS of the window's steps."""
    series = run[metric]
    first, last = window_of(run, metric, rest)
    inside = [v for t, v in zip(series.steps, series.values, strict=True) if first <= t <= last]
    if len(inside) < STUCK_STEPS:
        return None
    return sum(abs(v) <= stretch_tolerance(0.0, 1.0) for v in inside), len(inside)


def stretch_tolerance(low: float, high: float) -> float:
    """How far values may differ and still be one value: float rounding at the metric's scale (FLOAT_NOISE of its
    largest magnitude in the golden). A frozen lab optimizer's KL is 0 at most steps and 1e-9 at some (the actor's
    log-probs of a mini batch against the whole batch's differ by rounding); a clean step moves it by 1e-6 or more."""
    return FLOAT_NOISE * max(abs(low), abs(high))


def longest_stretch(steps, values, metric: str, low: float, high: float) -> tuple[int, int]:
    """(first index, length) of the longest stretch of consecutive logged steps whose finite values stay within float
    rounding (stretch_tolerance) of the stretch's first value, other than a rest at `metric`'s bounds (rest_bounds),
    for a golden whose runs span `low`..`high`: one computation for the golden's runs and the candidate. A step the
    series skips (its usual interval, the most common step between two of its values, exceeded: a lab step that kept
    no group updated nothing and logged no KL) ends a stretch; a NaN (a diverged run) is never one value."""
    tol, bounds = stretch_tolerance(low, high), rest_bounds(metric, low, high)
    gaps = collections.Counter(b - a for a, b in itertools.pairwise(steps))
    interval = gaps.most_common(1)[0][0] if gaps else 1
    start, best = 0, (0, 0)
    for i in range(1, len(values) + 1):
        if i == len(values) or not abs(values[i] - values[start]) <= tol or steps[i] - steps[i - 1] > interval:
            if (i - start > best[1] and math.isfinite(values[start])
                    and all(abs(values[start] - b) > tol for b in bounds)):
                best = (start, i - start)
            start = i
    return best


def most_at_one_value(steps, values, metric: str, low: float, high: float, first: int, last: int,
                      clip_rests: bool = False) -> tuple[list[int], int] | None:
    """(indices into `values` of the largest group at one finite value, in a row or not, to float rounding
    (stretch_tolerance), other than a rest at `metric`'s bounds (rest_bounds, `clip_rests`); the count of steps logged)
    over steps `first`..`last` (window_of), for a golden whose runs span `low`..`high`: one computation for the golden's
    runs and the candidate. None where the window holds fewer than STUCK_STEPS logged steps. A trainer that skips its
    update at every other step rests there (issue 43: quarter-updates logs `actor/ppo_kl` exactly 0 at each step with no
    update, never two in a row, where the golden's runs move it). The window, not the run: a clean lab seed rests once
    it has learned or collapsed (few groups kept, one on-policy mini batch a step, KL 0; every group alike, mean
    advantage 0), late; seed 214 held its mean advantage at 0 at 13 of 30 steps, 2 of them in steps 5-14, where
    quarter-updates holds its KL at 5 of 10."""
    inside = [i for i, t in enumerate(steps) if first <= t <= last]
    if len(inside) < STUCK_STEPS:
        return None
    tol, bounds = stretch_tolerance(low, high), rest_bounds(metric, low, high, clip_rests)
    best: list[int] = []
    for i in inside:
        v = values[i]
        if math.isfinite(v) and all(abs(v - b) > tol for b in bounds):
            held = [j for j in inside if abs(values[j] - v) <= tol]
            if len(held) > len(best):
                best = held
    return best, len(inside)


def rest_tolerance(metrics) -> CurveTolerance:
    """The tolerance whose window a count of steps at one value reads: the golden's reward's (the steps it vouches its
    runs learn in; verl's nightly 5th-14th steps unless --tolerance moved it), or the default one in a golden without
    a reward."""
    return metrics[REWARD].tolerance if REWARD in metrics else default_tolerance(REWARD)


def window_of(run: Run, metric: str, tol: CurveTolerance) -> tuple[int, int]:
    """`tol`'s window as absolute steps of `run` (window_steps), anchored at the run's first reward step, as the
    reward's window is (a lab step that kept no group logs no KL: a KL that starts a step late is still counted over
    the reward's window), or at `metric`'s own first step in a run that logs no reward."""
    return window_steps((run[REWARD] if REWARD in run else run[metric]).steps[0], tol)


def check_windows_reached(runs: list[Run], tolerances: dict[str, CurveTolerance]) -> None:
    """Refuse a --tolerance window some run logs its metric at fewer steps than: its statistic would judge nothing,
    said only by compare ('not judged'), and a calibration on it would measure nothing."""
    for metric, tol in tolerances.items():
        short = [r.name for r in runs if metric in r and len(r[metric]) < tol.window[1]]
        if short:
            raise BadInput(f"--tolerance {metric}:window={tol.window[0]}-{tol.window[1]}: run {short[0]} logs "
                           f"{metric} at fewer steps than the window's last; place it within the runs")


def rests_at_most_once(values, tol: float) -> bool:
    """Whether `values` move, resting at one value at most: apart from the most common value and those within `tol`
    of it (a rest at 0 logged as 0 and 1e-9), no value twice, and those others at least half of them. A quantized
    measurement repeats several (a mean response length of whole tokens over a batch) or rests most of the time (a
    batch's lowest reward, -2 at 13 of a clean verl run's 15 steps, -1.5 once); a correlation pinned at 1 jitters by
    ulps only."""
    rest = collections.Counter(values).most_common(1)[0][0]
    others = [v for v in values if abs(v - rest) > tol]
    return 2 * len(others) >= len(values) and len(set(others)) == len(others)


# A metric whose every golden value is within this of 0 measures float rounding (fp32 rollout/actor agreement,
# ~1e-8), not training: a stack whose rollout and actor agree bit for bit logs it at 0 for good.
FLOAT_NOISE = 1e-6
# A share by its name (a fraction clipped, a ratio cut at a cap): pinned at 0 or 1 by a converged run.
SHARE_NAMES = ("frac", "ratio")


def is_share(metric: str, low: float, high: float) -> bool:
    """Whether `metric` is a share: named as one and every golden value in [0, 1] (a gradient norm or an entropy that
    stays below 1 is not one)."""
    return any(word in metric.rsplit("/", 1)[-1] for word in SHARE_NAMES) and 0.0 <= low and high <= 1.0


# The policy update's clip fraction by its name (verl's and the lab's actor/pg_clipfrac): the share of tokens whose
# probability ratio the PPO clip cut. Not a value function's (critic/vf_clipfrac: its 0 says nothing of the policy),
# not dual-clip's lower clip (actor/pg_clipfrac_lower: 0 at most steps of clean runs), not a share generation
# produces (response_length/clip_ratio).
UPDATE_CLIP_NAMES = ("pg_clipfrac", "clipfrac", "clip_fraction")
VALUE_PREFIXES = ("critic/", "val/", "value/")
# The reward window CLIP_REST_SHARE was calibrated on (CurveTolerance's default): a window moved later (--tolerance
# ...:window=21-30) holds seeds that have converged and clip nothing, and counts no rest at the clip fraction's 0.
CLIP_REST_WINDOW = CurveTolerance.window


def counts_clip_rests(rest: CurveTolerance) -> bool:
    """Whether `rest`'s window (rest_tolerance) counts the update's clip fraction's rests at 0 (rest_bounds): the one
    golden and candidate alike are judged on, so both decide here."""
    return rest.window == CLIP_REST_WINDOW


def is_update_clip_name(metric: str) -> bool:
    """Whether `metric` is named as the policy update's clip fraction (UPDATE_CLIP_NAMES, not a value function's)."""
    return metric.rsplit("/", 1)[-1] in UPDATE_CLIP_NAMES and not metric.startswith(VALUE_PREFIXES)


def is_update_clip(metric: str, low: float, high: float) -> bool:
    """Whether `metric` is the policy update's clip fraction (is_update_clip_name), a share by its golden values."""
    return is_update_clip_name(metric) and 0.0 <= low and high <= 1.0


def rest_bounds(metric: str, low: float, high: float, clip_rests: bool = False) -> tuple[float, ...]:
    """The values a metric may rest at without a stuck trainer: the golden's own lowest and highest (a bound the
    metric saturates at: a batch's largest GRPO advantage is 2.4749 whenever one sample of 8 alone succeeds, and
    clean tiny verl runs held it there 7 steps in a row, where the golden's runs held it 3), and a share's 0 and 1
    (a converged run clips nothing). With `clip_rests` (most_at_one_value in the calibrated reward window,
    CLIP_REST_WINDOW) the update's clip fraction (is_update_clip) resting at 0 is counted (CLIP_REST_SHARE): a damped
    update (issue 43's damped-updates, every AdamW step a quarter of its move) rarely moves a token's ratio past the
    clip, and clipped nothing at 7-10 of the lab's window steps and 8-9 of the tiny verl run's, where clean seeds did
    at 0-7 and 0-2 (docs/curves.md, "The clip fraction's rests"); a clean run converges after that window."""
    if clip_rests and is_update_clip(metric, low, high):
        return (*((low,) if low > 0.0 else ()), high, 1.0)
    return (low, high, *((0.0, 1.0) if is_share(metric, low, high) else ()))


def find_moving(runs: list[Run], constants, rest: CurveTolerance) -> dict[str, Moving]:
    """metric -> (lowest, highest, longest stretch, most at one value, the median run's), for every metric all runs log
    at STUCK_STEPS steps or more, outside `constants`, the machine's measurements (a worker's actor/perf/* too) and
    float noise (FLOAT_NOISE), whose logged values across the runs move, resting at one value at most
    (rests_at_most_once: a continuous measurement and its rest value; or the update's clip fraction, is_update_clip),
    and are not all whole numbers (a count: the lab's kept groups, 8 at most steps): its range, the most steps in a row
    any run held one value (longest_stretch), the most steps of `rest`'s window (rest_tolerance) any run held one value
    at, in a row or not (most_at_one_value; None where no run logs STUCK_STEPS of the window's steps), and that count's
    median over the runs (the update's clip fraction is judged against it: stuck_limit)."""
    out = {}
    for metric in sorted(runs[0].series):
        if (metric in constants or metric.startswith(NOT_CONSTANT_PREFIXES) or "/perf/" in metric
                or not all(metric in r for r in runs)):
            continue
        values = [v for r in runs for v in r[metric].values]
        if (min(len(r[metric].values) for r in runs) < STUCK_STEPS or not all(map(_finite, values))
                or max(map(abs, values)) < FLOAT_NOISE or all(float(v).is_integer() for v in values)):
            continue
        low, high = min(values), max(values)
        # the update's clip fraction repeats its quantized shares (13/256 of the tokens) but is judged for its rests
        if rests_at_most_once(values, stretch_tolerance(low, high)) or is_update_clip(metric, low, high):
            counts = [len(found[0]) for r in runs if (found := most_at_one_value(
                r[metric].steps, r[metric].values, metric, low, high, *window_of(r, metric, rest),
                clip_rests=counts_clip_rests(rest)))]
            out[metric] = (low, high,
                           max(1, *(longest_stretch(r[metric].steps, r[metric].values, metric, low, high)[1]
                                    for r in runs)),
                           max(1, *counts) if counts else None,  # None: no run logs enough of the window
                           float(statistics.median(counts)) if counts else None)
    return out


def _moving_from_json(doc, where: str) -> dict[str, Moving]:
    # [lowest, highest, longest stretch, most at one value in the reward window, the median run's]; a golden recorded
    # before the stretch ([lowest, highest]) stored only metrics that never repeated a value: both are 1; one recorded
    # before the count (three entries) has none, and its runs' count is unknown: it judges stretches only
    # (curves.stuck says so); one recorded before the median (four) judges against twice the most, as it did
    def valid(r) -> bool:
        return (isinstance(r, list) and 2 <= len(r) <= 5 and all(type(v) in (int, float) and _finite(v) for v in r)
                and r[0] <= r[1] and all(type(n) is int and n >= 1 for n in r[2:4])
                and (len(r) < 5 or 0 <= r[4] <= r[3]))
    if not isinstance(doc, dict) or not all(map(valid, doc.values())):
        raise BadInput(f"{where}: \"moving\" must be an object of metric -> [lowest, highest, longest stretch, most "
                       "at one value, the median run's]; re-record it")
    return {m: (float(r[0]), float(r[1]), *((1, 1) if len(r) == 2 else (r[2], r[3] if len(r) >= 4 else None)),
                r[4] if len(r) == 5 else None)
            for m, r in doc.items()}


def _constants_from_json(doc, where: str) -> dict[str, Series]:
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: \"constants\" must be an object of metric -> {{steps, values}}; re-record it")
    out = {}
    for metric, entry in doc.items():
        steps, values = (entry.get("steps"), entry.get("values")) if isinstance(entry, dict) else (None, None)
        if (not isinstance(steps, list) or not isinstance(values, list) or not steps or len(steps) != len(values)
                or any(type(t) is not int or not 0 <= t < MAX_STEP for t in steps)
                or any(b <= a for a, b in itertools.pairwise(steps))
                or any(type(v) not in (int, float) or not _finite(v) for v in values)):
            raise BadInput(f"{where}: constants: {metric}: needs \"steps\" (increasing whole numbers) and as many "
                           "finite \"values\"; re-record it")
        # recorded before the jitter rule or a name rule (find_constants): never a constant
        if not jitters(values) and may_be_constant(metric):
            out[metric] = Series(tuple(steps), tuple(float(v) for v in values))
    return out


@dataclass(frozen=True)
class SanityLimit:
    """An absolute bound a healthy run stays within, with or without a baseline (NeMo-RL's nightly
    tests/check_metrics.py conditions, e.g. `mean(data["train/token_mult_prob_error"]) < 1.1`): at most
    `max_outliers` of the steps (a fraction) outside [low, high]; a non-finite value always fails."""

    metric: str
    low: float
    high: float
    max_outliers: float
    source: str


SANITY_LIMITS: tuple[SanityLimit, ...] = (
    # verl's DAPO reward: math_dapo's score is +1/-1, the overlong penalty adds down to -overlong_penalty_factor
    # (1.0 in verl's DAPO recipes): a mean reward outside [-2, 1] is not a DAPO reward.
    SanityLimit(REWARD, -2.0, 1.0, 0.0, "DAPO reward range: math_dapo score +-1, overlong penalty >= -1"),
    SanityLimit(RESPONSE_LENGTH, 0.0, math.inf, 0.0, "a length is never negative"),
    SanityLimit(GRAD_NORM, 0.0, math.inf, 0.0, "a norm is never negative; non-finite means the update diverged"),
    SanityLimit(PG_LOSS, -math.inf, math.inf, 0.0, "a finite policy loss"),
)
# Rollout vs actor probabilities of the sampled tokens: NeMo-RL fails a run whose token_mult_prob_error (the
# probability ratio) averages above 1.1; verl's absolute difference of probabilities is on the same scale.
# fp32: healthy ~1e-7, every real rollout fault of seed 001 >= 1e-3 in the lab. bf16: healthy ~4.4e-3 (a real
# Ascend run), so 0.05 is an order of magnitude of margin. A few spikes (5 %, NeMo-RL's ignore_top_p) pass.
PROBS_DIFF_LIMITS = {"fp32": 1e-3, "bf16": 0.05, "fp16": 0.05}


def sanity_limits(precision: str | None) -> tuple[SanityLimit, ...]:
    high = PROBS_DIFF_LIMITS.get(precision or "bf16", PROBS_DIFF_LIMITS["bf16"])
    return (*SANITY_LIMITS, SanityLimit(ROLLOUT_PROBS_DIFF, 0.0, high, 0.05,
                                        f"{precision or 'bf16 (precision unknown)'} rollout/actor mismatch limit; "
                                        "NeMo-RL: token_mult_prob_error < 1.1"))


_DTYPES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "bfloat16": "bf16", "bf16": "bf16",
           "float16": "fp16", "fp16": "fp16", "half": "fp16"}


def precision_name(dtype) -> str | None:
    """fp32 / bf16 / fp16 for a dtype name as verl's configs and meta.json write it ("float32", "bfloat16", ...)."""
    return _DTYPES.get(str(dtype).strip("'\"").lower())


def run_precision(run: Run) -> str | None:
    """The precision a run rolled out in: meta.json "precision", else its verl config's rollout dtype
    (actor_rollout_ref.rollout.dtype, verl's RolloutConfig), else fp32 for the tiny lab (harness/lab/loop.py
    builds its engine with dtype=torch.float32); None when nothing says."""
    extra = run.meta.extra
    named = extra.get("precision")
    config = extra.get("config")
    if named is None and isinstance(config, dict):
        rollout = (config.get("actor_rollout_ref") or {}).get("rollout") or {}
        named = rollout.get("dtype") if isinstance(rollout, dict) else None
    if named is not None:
        return _DTYPES.get(str(named).lower())
    return "fp32" if isinstance(extra.get("lab"), dict) else None


# The algorithm a DAPO run trains with, as verl resolved it (the run's Hydra config: harness.metrics.ingest): what an
# upgrade must not change silently -- a verl default that moved, a recipe edit -- and what a 15-step tiny run's
# curves cannot always show (DAPO's clip-higher lost changes nothing a few steps can see).
ALGORITHM_KEYS = (
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward",
    "algorithm.kl_ctrl.kl_coef", "algorithm.filter_groups.enable", "algorithm.filter_groups.metric",
    "actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.optim.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k",
    "data.max_response_length",
    # the batch a step trains on and how it is split into optimizer updates: one update per step makes every
    # update on-policy (actor/ppo_kl exactly 0 throughout), a different run from the golden's two
    "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
)
# What a golden recorded before it stored "algorithm_keys" was judged on (the two batch keys came after).
EARLIER_ALGORITHM_KEYS = ALGORITHM_KEYS[:-2]


def config_value(run: Run, key: str):
    """The dotted key's scalar in the run's resolved verl config (meta.json "config"); None where it has none."""
    node = run.meta.extra.get("config")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return None if isinstance(node, (dict, list)) else node


def algorithm_config(run: Run) -> dict[str, object] | None:
    """ALGORITHM_KEYS -> value in the run's resolved verl config (keys it lacks left out); None without a config."""
    if not isinstance(run.meta.extra.get("config"), dict):
        return None
    values = {key: config_value(run, key) for key in ALGORITHM_KEYS}
    return {key: value for key, value in values.items() if value is not None}


def run_seed(run: Run) -> int | None:
    """The seed of a run: meta.json "seed", or the lab config's seed."""
    extra = run.meta.extra
    seed = extra.get("seed", (extra.get("lab") or {}).get("seed") if isinstance(extra.get("lab"), dict) else None)
    return seed if type(seed) is int else None


def _common_host(runs: list[Run]) -> dict | None:
    hosts = [r.meta.extra.get("host") for r in runs]
    return hosts[0] if isinstance(hosts[0], dict) and all(h == hosts[0] for h in hosts) else None


def window_steps(first_step: int, tol: CurveTolerance) -> tuple[int, int]:
    """The window as absolute steps for a series whose first logged step is `first_step`."""
    return first_step + tol.window[0] - 1, first_step + tol.window[1] - 1


def window_stat(series: Series, first: int, last: int, stat: str, robust: bool = False) -> float | None:
    """mean/median of the series over steps first..last; None unless it logged every step there (finite).
    `robust` (a heavy-tailed metric): the mean is the trimmed mean (harness.metrics.stats.trimmed_mean)."""
    values = series.window(first, last).values
    if len(values) != last - first + 1 or not all(map(math.isfinite, values)):
        return None
    if stat == "median":
        return statistics.median(values)
    return stats.trimmed_mean(values) if robust else statistics.fmean(values)


def slope(series: Series, robust: bool = False) -> float | None:
    """Least-squares slope (per step) over the series' finite points; None if fewer than 2. `robust` (a
    heavy-tailed metric): the Theil-Sen slope."""
    pts = [(s, v) for s, v in zip(series.steps, series.values, strict=True) if math.isfinite(v)]
    if len(pts) < 2:
        return None
    if robust:
        return stats.theil_sen([s for s, _ in pts], [v for _, v in pts])
    return statistics.linear_regression([s for s, _ in pts], [v for _, v in pts]).slope


def spike_floor(tol: CurveTolerance):
    """The smallest excess a spike of this metric can have: the band's floor at its level (a step the band's
    floors already accept is no event)."""
    return lambda level: max(tol.band_atol, tol.band_rtol * abs(level))


def despiked(series: Series, tol: CurveTolerance, diff_cap: float = math.inf
             ) -> tuple[Series, tuple[stats.Spike, ...]]:
    """The series with its spikes (harness.metrics.stats.find_spikes, its noise read from a first-difference SD of
    at most `diff_cap`: the golden's MetricBaseline.spike_diff_cap) replaced by their neighbours' median, and the
    spikes: what every band, window and trend is computed from, while the spikes are judged as events. None where
    the tolerance judges no spikes (a share's bursts)."""
    if tol.spike_limit is None:
        return series, ()
    found = stats.find_spikes(series.values, spike_floor(tol), diff_cap)
    return (Series(series.steps, stats.despike(series.values, found)) if found else series), found


@dataclass(frozen=True)
class ReferenceCurve:
    """One reference run's curve of one metric (finite values, strictly increasing steps) and its seed."""

    name: str
    seed: int | None
    series: Series


@dataclass(frozen=True)
class MetricBaseline:
    """One metric's reference: the runs' curves and the tolerance; centre, spread and bands derived."""

    runs: tuple[ReferenceCurve, ...]
    tolerance: CurveTolerance

    @property
    def n_runs(self) -> int:
        return len(self.runs)

    @cached_property
    def steps(self) -> tuple[int, ...]:
        """Steps every reference run logged: the band is drawn there."""
        common = reduce(set.intersection, (set(r.series.steps) for r in self.runs[1:]), set(self.runs[0].series.steps))
        return tuple(sorted(common))

    @cached_property
    def _columns(self) -> list[list[float]]:
        maps = [r.series.as_dict() for r in self.runs]
        return [[m[s] for m in maps] for s in self.steps]

    @cached_property
    def center(self) -> tuple[float, ...]:
        """The per-step centre of the runs as recorded (the golden file's Megatron "values")."""
        return tuple(stats.centre(column) for column in self._columns)

    @cached_property
    def spike_diff_cap(self) -> float:
        """The largest first-difference SD a run's noise is read from when its spikes are found, in the candidate and
        in these runs alike: the upper bound of these runs' pooled one (harness.metrics.stats.SPIKE_NOISE_CONFIDENCE),
        each run despiked by its own noise first."""
        first = stats.pooled_noise([despiked(r.series, self.tolerance)[0].values for r in self.runs])
        return stats.noise_bound(first.diff_sd, first.df)

    @cached_property
    def _despiked(self) -> tuple[tuple[Series, tuple[stats.Spike, ...]], ...]:
        return tuple(despiked(r.series, self.tolerance, self.spike_diff_cap) for r in self.runs)

    @cached_property
    def clean_runs(self) -> tuple[Series, ...]:
        """Each run's curve with its spikes replaced by their neighbours' median: what the band's centre and
        spread, the noise model and the runs' window and trend statistics are computed from."""
        return tuple(series for series, _ in self._despiked)

    @cached_property
    def _clean_columns(self) -> list[list[float]]:
        maps = [r.as_dict() for r in self.clean_runs]
        return [[m[s] for m in maps] for s in self.steps]

    @cached_property
    def band_center(self) -> tuple[float, ...]:
        """The band's centre: the per-step centre of the despiked runs (a spike in a 1- or 2-run golden, whose
        centre is the mean, no longer moves it)."""
        return tuple(stats.centre(column) for column in self._clean_columns)

    @cached_property
    def heavy_tailed(self) -> bool:
        """Whether this metric is heavy-tailed, decided from these runs (harness.metrics.stats.heavy_tailed): its
        window and trend then take robust centres."""
        return stats.heavy_tailed([r.series.values for r in self.runs], spike_floor(self.tolerance),
                                  self.spike_diff_cap)

    @cached_property
    def positive(self) -> bool:
        """Whether this metric is positive, decided from these runs (every value > 0: a norm, a length, a gap): its
        band's and window's lower edge then never reaches 0 (harness.metrics.curves.edges)."""
        return all(v > 0 for r in self.runs for v in r.series.values)

    @cached_property
    def spikes(self) -> tuple[int, int]:
        """(spikes, run-steps) over the runs: what a candidate's spike count is bounded by."""
        return sum(len(found) for _, found in self._despiked), sum(len(r.series) for r in self.runs)

    @cached_property
    def level(self) -> float:
        """The metric's level a spike's size is measured in: the median |centre|, or the noise SD or the band's
        absolute floor where that is larger (a metric near 0, a constant one)."""
        return max(statistics.median(abs(c) for c in self.band_center), self.noise.sigma, self.tolerance.band_atol,
                   1e-300)

    @cached_property
    def largest_spike(self) -> float:
        """The largest spike of the runs, in units of `level` (0 when none spiked)."""
        return max((s.excess / self.level for _, found in self._despiked for s in found), default=0.0)

    @cached_property
    def spreads(self) -> tuple[tuple[float, int], ...]:
        """(s, df) per step: the robust spread across runs pooled over `pool` neighbouring steps each side, shrunk
        toward the noise model (harness.metrics.stats.shrunk): one run is judged by its noise alone."""
        tol = self.tolerance
        across = (stats.pooled_spreads(self._clean_columns, tol.pool) if self.n_runs > 1
                  else [(0.0, 0)] * len(self.steps))
        prior = tol.band_inflation * self.noise.sigma
        return tuple(stats.shrunk(prior, self.noise.df, s, df) for s, df in across)

    @cached_property
    def noise(self) -> stats.Noise:
        """The reference runs' step-to-step noise (harness.metrics.stats.run_noise), pooled, of the despiked
        curves (a spike is an event, not noise)."""
        return stats.pooled_noise([r.values for r in self.clean_runs])

    def half_width(self, i: int) -> float:
        """Band half-width at step index i: the metric's floors, or the prediction interval of one new run."""
        tol = self.tolerance
        floor = max(tol.band_atol, tol.band_rtol * abs(self.band_center[i]))
        s, df = self.spreads[i]
        return max(floor, stats.prediction_half_width(s, df, self.n_runs, tol.confidence))

    def predict(self, values: list[float], prior_sd: float) -> tuple[float, float, str]:
        """(centre, prediction half-width, how) of one new run's statistic, from the reference runs' values of it
        and the noise model's SD of it (`prior_sd`, before inflation)."""
        center, s, df, spread = self.prediction_sd(values, prior_sd)
        how = (f"noise model sd {prior_sd:.3g}" + (f" + spread of {len(values)} runs {spread:.3g}"
                                                   if len(values) > 1 else " (1 reference run)"))
        return center, stats.prediction_half_width(s, df, self.n_runs, self.tolerance.confidence), how

    def prediction_sd(self, values: list[float], prior_sd: float) -> tuple[float, float, int, float]:
        """(centre, s, df, spread across runs) behind `predict`: one new run's statistic is centre + s * sqrt(1 +
        1/N) * T_df (harness.metrics.power simulates that)."""
        center = stats.centre(values)
        spread, spread_df = stats.robust_spread([[v - center for v in values]]) if len(values) > 1 else (0.0, 0)
        s, df = stats.shrunk(prior_sd, self.noise.df, spread, spread_df)
        return center, s, df, spread

    def series(self) -> Series:
        return Series(self.steps, self.center)

    def run_statistics(self, fn) -> list[float | None]:
        """fn(series) per reference run, on its despiked curve (None where a run cannot give it)."""
        return [fn(series) for series in self.clean_runs]

    def to_json(self) -> dict:
        # Megatron's golden shape (start_step, end_step, step_interval, values = the centre) on the grid of every
        # step any run logged; each run's values on the same grid, null where it did not log the step.
        every = sorted(set().union(*(r.series.steps for r in self.runs)))
        start, end = every[0], every[-1]
        interval = reduce(math.gcd, (b - a for a, b in itertools.pairwise(every)), 0) or 1
        grid = range(start, end + 1, interval)
        centre = dict(zip(self.steps, self.center, strict=True))
        maps = [r.series.as_dict() for r in self.runs]
        return {"start_step": start, "end_step": end, "step_interval": interval,
                "values": [centre.get(s) for s in grid], "n_runs": self.n_runs,
                "runs": [{"name": r.name, "seed": r.seed, "values": [m.get(s) for s in grid]}
                         for r, m in zip(self.runs, maps, strict=True)],
                "tolerance": self.tolerance.to_json()}

    @classmethod
    def from_json(cls, doc, where: str, metric: str = "") -> MetricBaseline:
        if not isinstance(doc, dict):
            raise BadInput(f"{where}: a metric entry must be an object, got {type(doc).__name__}; re-record it")
        try:
            start, end, interval = doc["start_step"], doc["end_step"], doc["step_interval"]
            runs_doc, values, tolerance = doc["runs"], doc["values"], doc["tolerance"]
        except KeyError as exc:
            raise BadInput(f"{where}: missing {exc}; re-record it with `ascend-rl-harness baseline record`") from None
        # bounded before range()/len(): end_step 10**300 overflowed a C ssize_t, start_step 2**70 lay beyond every
        # step a run logs (harness.numeric.MAX_STEP) and every statistic was silently skipped
        if any(type(x) is not int for x in (start, end, interval)) or interval < 1 or end < start or start < 0 \
                or end >= MAX_STEP:
            raise BadInput(f"{where}: start_step/end_step/step_interval must be whole numbers, 0 <= start <= end < "
                           f"2^62, interval >= 1 (got {str(start)[:24]}, {str(end)[:24]}, {str(interval)[:24]})")
        points = (end - start) // interval + 1
        if not isinstance(values, list) or points != len(values):
            raise BadInput(f"{where}: \"values\" holds {len(values) if isinstance(values, list) else 'no list of'} "
                           f"values for the {points} steps of start_step..end_step; re-record it")
        grid = range(start, end + 1, interval)
        if not isinstance(runs_doc, list) or not runs_doc:
            raise BadInput(f"{where}: \"runs\" must be a non-empty list of the reference runs' curves")
        if "n_runs" in doc and doc["n_runs"] != len(runs_doc):
            raise BadInput(f"{where}: n_runs is {doc['n_runs']!r} but {len(runs_doc)} runs are stored; re-record it")
        runs = tuple(_curve_from_json(r, grid, f"{where}: runs[{i}]") for i, r in enumerate(runs_doc))
        baseline = cls(runs=runs, tolerance=CurveTolerance.from_json(tolerance, where, metric))
        if not baseline.steps:
            raise BadInput(f"{where}: the reference runs share no step; re-record it")
        expected = dict(zip(baseline.steps, baseline.center, strict=True))
        if not isinstance(values, list) or len(values) != len(grid) or any(
                not (v is None and s not in expected) and not (
                    type(v) in (int, float) and s in expected and _finite(v)
                    and math.isclose(v, expected[s], rel_tol=1e-9, abs_tol=1e-12))
                for s, v in zip(grid, values, strict=True)):
            raise BadInput(f"{where}: \"values\" are not the centre of its runs (edited by hand?); re-record it")
        return baseline


def _curve_from_json(doc, grid: range, where: str) -> ReferenceCurve:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not isinstance(doc.get("values"), list):
        raise BadInput(f"{where}: a run must be {{\"name\": str, \"seed\": int|null, \"values\": [...]}}")
    seed, values = doc.get("seed"), doc["values"]
    if seed is not None and type(seed) is not int:
        raise BadInput(f"{where}: seed {seed!r} is not a whole number")
    if len(values) != len(grid):
        raise BadInput(f"{where}: {len(values)} values for {len(grid)} steps of start_step..end_step")
    pairs = [(s, v) for s, v in zip(grid, values, strict=True) if v is not None]
    bad = [s for s, v in pairs if type(v) not in (int, float) or not _finite(v)]
    if bad:
        raise BadInput(f"{where}: step {bad[0]} holds {str(dict(pairs)[bad[0]])[:40]}, not a finite number within "
                       f"+-{METRIC_LIMIT:g}")
    if not pairs:
        raise BadInput(f"{where}: every value is null; re-record the baseline")
    return ReferenceCurve(name=doc["name"], seed=seed,
                          series=Series(tuple(s for s, _ in pairs), tuple(float(v) for _, v in pairs)))


@dataclass(frozen=True)
class Baseline:
    """Reference curves for several metrics plus provenance (hardware, precision, versions, date, runs)."""

    metrics: dict[str, MetricBaseline]
    provenance: dict = field(default_factory=dict)
    name: str = "baseline"
    # metric -> per-step values every reference run logged alike (find_constants); None: a schema-2 golden, which
    # stored none (CONSTANTS_MISSING), as opposed to {} (none were alike)
    constants: dict[str, Series] | None = field(default_factory=dict)
    # the MDE table (harness.metrics.power.power_table) as recorded; None for a golden recorded without it
    power: dict | None = None
    # metric -> Moving (lowest, highest, longest stretch at one value, most steps at one value and the median run's:
    # None for a golden recorded before them) of the metrics the runs moved (find_moving); empty for a golden recorded
    # before them
    moving: dict[str, Moving] = field(default_factory=dict)

    @property
    def precision(self) -> str | None:
        return self.provenance.get("precision")

    @property
    def n_runs(self) -> int:
        return max((m.n_runs for m in self.metrics.values()), default=0)

    @classmethod
    def from_runs(cls, runs: list[Run], metrics: tuple[str, ...] = ALIGN_METRICS,
                  tolerances: dict[str, CurveTolerance] | None = None, *, source: str | None = None) -> Baseline:
        """Derive a baseline from reference runs. Their values must be finite: a NaN in a reference is a
        broken reference, not a band."""
        if not runs:
            raise BadInput("no reference runs given")
        precisions = {run_precision(r) for r in runs}
        if len(precisions) > 1:
            raise BadInput(f"reference runs mix precisions {sorted(map(str, precisions))}; record one per precision")
        (precision,) = precisions
        algorithms = [algorithm_config(r) for r in runs]
        if any(a != algorithms[0] for a in algorithms):
            differ = next(r.name for r, a in zip(runs, algorithms, strict=True) if a != algorithms[0])
            raise BadInput(f"reference runs train different algorithms ({runs[0].name} vs {differ}: their verl "
                           "configs differ in ALGORITHM_KEYS); record one golden per recipe")
        out = {}
        for metric in metrics:
            missing = [r.name for r in runs if metric not in r]
            if missing:
                raise BadInput(f"reference run {missing[0]} has no metric {metric!r}; record without it "
                               "(--metric) or pass runs that log it")
            curves = []
            for r in runs:
                series = r[metric]
                bad = [(s, v) for s, v in zip(series.steps, series.values, strict=True) if not math.isfinite(v)]
                if bad:
                    raise BadInput(f"reference run {r.name} ({', '.join(r.meta.sources[:1]) or 'no source'}): "
                                   f"{metric} is {bad[0][1]} at step {bad[0][0]} ({len(bad)} non-finite values); "
                                   "a diverged run cannot be a reference")
                curves.append(ReferenceCurve(name=r.name, seed=run_seed(r), series=series))
            tol = (tolerances or {}).get(metric) or default_tolerance(metric, precision)
            baseline = MetricBaseline(runs=tuple(curves), tolerance=tol)
            if not baseline.steps:
                raise BadInput(f"reference runs share no steps of {metric!r}")
            out[metric] = baseline
        first = runs[0].meta
        provenance = {"source": source or ("lab" if "lab" in first.extra else "verl"),
                      "runs": [r.name for r in runs], "seeds": [run_seed(r) for r in runs],
                      "sources": [src for r in runs for src in r.meta.sources],
                      "scale": first.scale, "hardware": first.hardware, "devices": first.devices,
                      "precision": precision, "versions": dict(first.versions),
                      # the CPU kernels the runs were computed with (harness.config.host): exact mode is bit for
                      # bit only on a host with the same; None when the runs disagree or do not say
                      "host": _common_host(runs),
                      # what the runs shared (a candidate that differs is told so); seed and length may differ
                      "config": {k: v for k, v in (first.extra.get("lab") or {}).items() if k not in RUN_ONLY_LAB_KEYS},
                      # verl's resolved algorithm settings (ALGORITHM_KEYS); a candidate that differs fails on them
                      "algorithm": algorithms[0],
                      # the settings judged: a key the golden's verl lacked is judged too (a candidate whose verl
                      # gained it changed the algorithm), a key added to ALGORITHM_KEYS later is not
                      "algorithm_keys": list(ALGORITHM_KEYS) if algorithms[0] is not None else None,
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        return cls(out, provenance, name="+".join(r.name for r in runs) if len(runs) <= 3 else
                   f"{runs[0].name}+{len(runs) - 1} more", constants=(constants := find_constants(
                       runs, ALIGN_METRICS + metrics)), moving=find_moving(runs, constants, rest_tolerance(out)))

    def retuned(self, inflation: dict[str, tuple[float, ...]], rest_shares: dict[str, float] | None = None
                ) -> Baseline:
        """The same reference runs judged with another noise inflation per metric (band, window, trend) and, for each
        metric `rest_shares` names, its clip-rest floor (CurveTolerance.rest_share; None: the prior, CLIP_REST_SHARE),
        every other tolerance field kept: a recalibration (scripts/calibrate-curves --golden) applies to committed
        goldens, whose tolerances were stored when they were recorded."""
        def tuned(m: str, tol: CurveTolerance) -> CurveTolerance:
            tol = tol.with_inflation(inflation[m]) if m in inflation else tol
            return dataclasses.replace(tol, rest_share=rest_shares[m]) if m in (rest_shares or {}) else tol
        return dataclasses.replace(self, metrics={m: dataclasses.replace(b, tolerance=tuned(m, b.tolerance))
                                                  for m, b in self.metrics.items()},
                                   power=None)  # other tolerances: another power (harness.metrics.power)

    def judged(self, metrics: tuple[str, ...]) -> Baseline:
        """The baseline as a comparison of `metrics` judges it: one false-alarm budget for their band, window and
        trend statistics (FAMILY_ALPHA), each statistic's alpha scaled down in proportion when together they would
        spend more; never loosened (a comparison of a few metrics keeps the confidence they were calibrated at)."""
        spent = sum(len(INFLATED_STATISTICS) * (1 - self.metrics[m].tolerance.confidence) for m in metrics)
        scale = min(1.0, FAMILY_ALPHA / spent) if spent > 0 else 1.0
        if scale == 1.0:
            return self
        return dataclasses.replace(self, metrics={m: dataclasses.replace(b, tolerance=dataclasses.replace(
            b.tolerance, confidence=1 - (1 - b.tolerance.confidence) * scale)) if m in metrics else b
            for m, b in self.metrics.items()})

    def as_runs(self) -> list[Run]:
        """The golden's reference runs as Runs: their stored curves, seed and precision (and the lab's config for a
        lab golden), as the self-check judges them."""
        first = next(iter(self.metrics.values()))
        lab = {"lab": self.provenance.get("config") or {}} if self.provenance.get("source") == "lab" else {}
        return [Run(curve.name, {m: b.runs[i].series for m, b in self.metrics.items()},
                    RunMeta(extra={"seed": curve.seed, "precision": self.precision, **lab}))
                for i, curve in enumerate(first.runs)]

    def without(self, index: int) -> Baseline:
        """The baseline of every reference run but the index-th (the leave-one-out self-check)."""
        left_out = next(iter(self.metrics.values())).runs[index].name
        return dataclasses.replace(self, metrics={
            m: dataclasses.replace(b, runs=b.runs[:index] + b.runs[index + 1:]) for m, b in self.metrics.items()},
            name=f"{self.name} without {left_out}")

    def subset(self, indices) -> Baseline:
        """The baseline of the reference runs at `indices` (calibration and its measurement)."""
        keep = tuple(indices)
        return dataclasses.replace(self, metrics={
            m: dataclasses.replace(b, runs=tuple(b.runs[i] for i in keep)) for m, b in self.metrics.items()},
            name="+".join(next(iter(self.metrics.values())).runs[i].name for i in keep))

    def to_json(self) -> dict:
        metrics = {m: b.to_json() for m, b in self.metrics.items()}
        if self.constants is None:  # a schema-2 golden rewritten (a retune) stays one: it never knew its constants
            return versioned(SCHEMA, 2, {"provenance": self.provenance, "metrics": metrics})
        constants = {m: {"steps": list(c.steps), "values": list(c.values)} for m, c in self.constants.items()}
        return versioned(SCHEMA, SCHEMA_VERSION, {"provenance": self.provenance, **(
            {"power": self.power} if self.power is not None else {}), "metrics": metrics, "constants": constants,
            **({"moving": {m: [x for x in r if x is not None] for m, r in self.moving.items()}} if self.moving
               else {})})

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write atomically; refuse to overwrite an existing baseline unless `force` -- atomic against another
        writer (linked into place: checking first let two `baseline record`s both succeed)."""
        return write_json_atomic(path, self.to_json(), overwrite=force,
                                 exists="pass --force to replace it")


def is_baseline_file(path: str | Path) -> bool:
    """True for a JSON file carrying the baseline schema key (cheap sniff of the first bytes)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".json":
        return False
    with path.open("rb") as f:
        return SCHEMA.encode() in f.read(4096)


def load_baseline(path: str | Path) -> Baseline:
    """Load a golden file; refuses unknown schema versions and malformed entries with a clear message."""
    path = Path(path)
    doc = read_versioned(path, schema=SCHEMA, version=READABLE_VERSIONS, what="baseline",
                         hint="re-record it with `ascend-rl-harness baseline record` (scripts/make-tiny-golden for "
                              "the tiny lab golden)",
                         missing=f"no such baseline; record one with `ascend-rl-harness baseline record RUN... "
                                 f"--out {path}`")
    metrics_doc, provenance = doc.get("metrics"), doc.get("provenance", {})
    if not isinstance(metrics_doc, dict) or not metrics_doc:
        raise BadInput(f"{path}: \"metrics\" must be an object of metric name -> curves; re-record the baseline")
    if not isinstance(provenance, dict):
        raise BadInput(f"{path}: \"provenance\" must be an object; re-record the baseline")
    metrics = {m: MetricBaseline.from_json(d, f"{path}: {m}", m) for m, d in metrics_doc.items()}
    if provenance.get("precision") not in (None, *PRECISIONS):
        raise BadInput(f"{path}: provenance precision {provenance.get('precision')!r} is not one of {PRECISIONS}")
    if doc["schema_version"] < 3:
        return Baseline(metrics, provenance, name=path.stem, constants=None)
    if "constants" not in doc:
        raise BadInput(f"{path}: a schema-3 golden holds \"constants\"; re-record it")
    power = doc.get("power")
    if power is not None and not isinstance(power, dict):
        raise BadInput(f"{path}: \"power\" must be an object (the MDE table); re-record it")
    return Baseline(metrics, provenance, name=path.stem, constants=_constants_from_json(doc["constants"], str(path)),
                    power=power, moving=_moving_from_json(doc.get("moving", {}), str(path)))
