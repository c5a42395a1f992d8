"""The statistics behind curve verdicts, from any number of reference runs (one included): a robust centre, a
noise model from the runs' own step-to-step noise, the spread across runs where there are several, and Student-t
prediction intervals for one new run.

Why not mean +- k*std per step (what the harness did first): with N = 1..5 reference runs the per-step std is
itself noise (100 % false alarms on clean lab runs with 1 reference run, 72 % with 2, 24 % with 3). Why not the
spread across runs alone (the next version): one run has none, so one-vs-one (seed 003's NPU run against one GPU
run; "before vs after the upgrade") could never fail, and three runs that happen to agree closely gave bands so
narrow that one golden in twenty flagged most clean candidates. Here:

- centre: the per-step median of the runs (N >= 3; one bad run cannot move it), the mean below 3;
- noise model (`run_noise`): each run's step-to-step noise from its first and second differences (a smooth trend
  cancels in them), with the lag-1 autocorrelation an AR(1) model infers from their ratio; a statistic's noise SD
  follows from it (a window mean of m steps: sigma / sqrt(m) x the AR(1) variance inflation; a slope over k steps:
  sigma / sqrt(Sxx) x the same). What the noise model leaves out -- runs of other seeds take other paths -- is a
  per-metric, per-statistic factor measured on calibration seeds (`NOISE_INFLATION` in harness.metrics.baseline,
  scripts/calibrate-curves);
- spread across runs (N >= 2): residuals from the centre, pooled over neighbouring steps, each clipped at
  CLIP_MADS robust SDs, so one bad run adds a bounded amount;
- the two combined as a scaled-inverse-chi-square update (`shrunk`): the noise model is a prior worth the degrees
  of freedom its estimate has (EFFECTIVE_DF; at most MAX_PRIOR_DF), the runs' spread adds theirs; a new run falls within
  centre +- t(df, confidence) * s * sqrt(1 + 1/N).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

from harness.errors import BadInput

# Fewer runs than this give no spread across runs (the median centre needs 3): below it the noise model carries
# the verdict alone (1 run) or mostly (2 runs).
MIN_CALIBRATED_RUNS = 3
# The noise model counts for what its estimate is worth (EFFECTIVE_DF: one 30-step run 11), at most this many, when
# combined with the runs' own spread: a 3-run golden adds 2 (window, trend) or ~10 (band, pooled over 5 steps), a
# 5-run golden 4 or ~20. The cap keeps a long curve's noise from outweighing what several seeds show.
MAX_PRIOR_DF = 30
# What one run's noise estimate from k second differences is worth, as pooled_noise gives it (its autocorrelation
# shrunk): the degrees of freedom of the chi-square whose spread its sigma^2 has (2 / the squared coefficient of
# variation of sigma^2), measured by simulation (white Gaussian noise around a straight line, 40,000 runs per k;
# tests/test_curves.py re-simulates). Not k: the local centring, the winsorizing and the estimated autocorrelation
# each cost precision. Counted as k, the t quantile of a one-run golden of 15 steps took df 13 for what is worth 5.9:
# its sigma read below 0.39x the truth in 1 % of runs, not the 0.56x df 13 promises, and such a golden was too
# narrow: one of 21 one-run goldens of the tiny verl recipe flagged 7 of 20 clean seeds (its grad-norm sigma read
# 0.155 against the seeds' median 0.383). Simulated, a one-run band at 0.998 now holds: a new run's steps fall
# outside it at 0.0019 / 0.0015 (15 / 30 steps; 0.0081 / 0.0046 with the count of differences). Runs are summed;
# with their autocorrelation pooled that overstates a little (three 30-step runs: 29 measured, 34 summed), which
# MAX_PRIOR_DF caps. The spread across runs keeps its count of residuals. Linear in between; beyond the last entry,
# its share of k.
EFFECTIVE_DF = ((3, 2.0), (4, 2.0), (5, 2.6), (6, 2.8), (8, 3.6), (10, 4.4), (13, 5.9), (18, 7.7), (23, 9.7),
                (28, 11.2), (38, 14.2), (58, 19.5), (98, 26.6))
# First differences are centred on the median of this many neighbours each side (see run_noise); on noise alone the
# centring changes their SD by ~1 % (simulated, n = 30), so it needs no correction.
SLOPE_NEIGHBOURS = 3
# The autocorrelation of one 30-step curve is a noisy estimate (simulated on white noise: median 0, 90th
# percentile 0.73), and it enters the window and trend tolerances as (1 + rho) / (1 - rho): it is shrunk toward 0
# as if 0 had been seen in this many differences (one 30-step run: x0.22; five: x0.58). Simulated (30 steps): the
# window-mean noise SD of one white-noise run then reads 0.72-1.40x the truth (10th-90th percentile) instead of
# 0.72-1.73x; what the shrinkage leaves of real autocorrelation the calibrated inflation covers.
RHO_PRIOR_DF = 100
MAX_AUTOCORRELATION = 0.8
# Residuals beyond this many robust standard deviations are clipped (Huber's winsorizing; 2.5 keeps ~98 % of a
# Gaussian residual's variance, WINSOR_VARIANCE below, and bounds what one bad run adds).
CLIP_MADS = 2.5
# The robust helpers below stay on `statistics` (the t quantile is scipy's): scipy.stats.median_abs_deviation would
# replace one median, while the winsorizing, the odd group's zero residual and the clip's variance correction are
# this model's own and have no scipy counterpart.
MAD_TO_SD = 1.4826  # 1 / Phi^-1(3/4): the MAD of Gaussian noise x this is its standard deviation


def _winsor_variance(c: float) -> float:
    """E[min(z^2, c^2)] for standard normal z: the fraction of the variance a clip at c keeps."""
    tail = 0.5 * math.erfc(c / math.sqrt(2))  # P(z > c)
    density = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    return 1 - 2 * tail - 2 * c * density + 2 * c * c * tail


WINSOR_VARIANCE = _winsor_variance(CLIP_MADS)


def centre(values: Sequence[float]) -> float:
    """Median of >= MIN_CALIBRATED_RUNS values (robust to one bad run), else the mean."""
    return statistics.median(values) if len(values) >= MIN_CALIBRATED_RUNS else statistics.fmean(values)


def robust_spread(residual_groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(s, df): the standard deviation of one run's value around its group's centre, from the residuals of
    several groups (a step and its neighbours; or one group), each group's residuals measured from its own
    centre. Residuals are clipped at CLIP_MADS robust SDs; df = sum of (group size - 1)."""
    flat = [abs(r) for group in residual_groups for r in group]
    df = sum(len(group) - 1 for group in residual_groups)
    if df <= 0:
        return 0.0, 0
    # The median run of an odd group sits on its centre: its zero residual says nothing about the spread.
    informative = [r for group in residual_groups
                   for r in sorted(map(abs, group))[len(group) % 2 if len(group) >= MIN_CALIBRATED_RUNS else 0:]]
    mad = statistics.median(informative)
    clip = CLIP_MADS * MAD_TO_SD * mad if mad > 0 else math.inf  # ties (a discrete metric): no clip
    clipped = sum(min(r, clip) ** 2 for r in flat)
    return math.sqrt(clipped / df / (WINSOR_VARIANCE if mad > 0 else 1.0)), df


@lru_cache(maxsize=256)
def t_quantile(df: int, confidence: float) -> float:
    """Two-sided Student-t quantile: P(|T_df| <= q) = confidence."""
    from scipy.special import stdtrit  # the t quantile; `statistics` has none

    return float(stdtrit(df, 0.5 + confidence / 2))


def prediction_half_width(s: float, df: int, n: int, confidence: float) -> float:
    """Half-width of the Student-t prediction interval for one new value: t * s * sqrt(1 + 1/n)."""
    if df <= 0 or n < 1:
        return 0.0
    return t_quantile(df, confidence) * s * math.sqrt(1 + 1 / n)


def pooled_spreads(columns: Sequence[Sequence[float]], pool: int) -> list[tuple[float, int]]:
    """Per step (a column holds the runs' values at that step): (s, df) pooled over steps i-pool..i+pool."""
    residuals = []
    for column in columns:
        c = centre(column)
        residuals.append([v - c for v in column])
    out = []
    for i in range(len(columns)):
        out.append(robust_spread(residuals[max(0, i - pool):i + pool + 1]))
    return out


@dataclass(frozen=True)
class RatioInterval:
    """The geometric mean of n paired ratios and its Student-t confidence interval, taken on the log ratios
    (timing noise is multiplicative: a loaded machine slows a round by a factor, not by a fixed time)."""

    ratio: float
    low: float
    high: float
    n: int
    confidence: float  # two-sided: each bound alone holds with (1 + confidence) / 2

    def to_dict(self) -> dict:
        return asdict(self)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float], confidence: float) -> RatioInterval:
    """numerator_i / denominator_i over paired rounds (measured back to back, so load from other processes hits
    both alike and cancels in the ratio). One round slowed or sped up by the machine widens the interval rather
    than moving a verdict: a verdict reads a bound, never one round (one noisy eager round once
    failed graph mode at 0.54x while the medians were 40.1 vs 39.0 tok/s)."""
    if len(numerators) != len(denominators) or len(numerators) < 2:
        raise BadInput(f"paired ratio: needs >= 2 pairs of rounds, got {len(numerators)} and {len(denominators)}")
    if not all(v > 0 and math.isfinite(v) for v in (*numerators, *denominators)):
        raise BadInput("paired ratio: every round must be a positive finite number")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators, strict=True)]
    mean, n = statistics.fmean(logs), len(logs)
    half = t_quantile(n - 1, confidence) * statistics.stdev(logs) / math.sqrt(n)
    return RatioInterval(ratio=math.exp(mean), low=math.exp(mean - half), high=math.exp(mean + half), n=n,
                         confidence=confidence)


@dataclass(frozen=True)
class Noise:
    """A curve's step-to-step noise: SD `sigma` of one step's value around the curve's smooth trend, lag-1
    autocorrelation `rho` (AR(1)), and `df`: run_noise's, the second differences it was estimated from;
    pooled_noise's, what the estimate is worth (effective_df); 0: no estimate."""

    sigma: float
    rho: float
    df: int
    diff_sd: float = 0.0  # SD of the (locally centred) first differences: 2 sigma^2 (1 - rho) is their variance

    def ar_inflation(self) -> float:
        """Variance of a mean of m autocorrelated steps over sigma^2/m (large m): (1 + rho) / (1 - rho)."""
        return (1 + self.rho) / (1 - self.rho)

    def mean_sd(self, m: int) -> float:
        """Noise SD of the mean of m consecutive steps."""
        return self.sigma * math.sqrt(self.ar_inflation() / max(m, 1))

    def slope_sd(self, steps: Sequence[int]) -> float:
        """Noise SD of a least-squares slope over these steps."""
        mean = statistics.fmean(steps)
        sxx = sum((t - mean) ** 2 for t in steps)
        return self.sigma * math.sqrt(self.ar_inflation() / sxx) if sxx > 0 else math.inf


def _winsorized_sd(values: Sequence[float]) -> float:
    """SD of values around their median, each deviation clipped at CLIP_MADS robust SDs first (one spike adds a
    bounded amount) and the clip's variance loss undone; the plain RMS where the MAD is 0 (a discrete metric).
    Not the MAD itself: from 15-30 differences its SD is ~2.7x the plain one's, and the noise model's
    autocorrelation is a ratio of two of them."""
    if not values:
        return 0.0
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    if mad <= 0:
        return math.sqrt(statistics.fmean((v - mid) ** 2 for v in values))
    clip = CLIP_MADS * MAD_TO_SD * mad
    return math.sqrt(statistics.fmean(min(abs(v - mid), clip) ** 2 for v in values) / WINSOR_VARIANCE)


def run_noise(values: Sequence[float]) -> Noise:
    """The step-to-step noise of one curve (consecutive logged steps). For AR(1) noise e around a smooth trend,
    first differences have variance 2 sigma^2 (1 - rho) and second differences 2 sigma^2 (1 - rho)(3 - rho): the
    trend cancels (its slope only shifts the first differences' median), their variance ratio gives rho, and
    either gives sigma. Winsorized SDs, so one spike does not set the noise."""
    d1 = [b - a for a, b in zip(values, values[1:], strict=False)]
    d2 = [b - a for a, b in zip(d1, d1[1:], strict=False)]
    if len(d2) < 3:
        return Noise(0.0, 0.0, 0)
    # The trend's slope changes (a reward that rises, then plateaus) move the first differences' level: each is
    # measured from the median of its neighbours, so only the noise remains (measured: a curve with one kink read
    # rho 0.5 on white noise without it).
    local = [d1[i] - statistics.median(d1[max(0, i - SLOPE_NEIGHBOURS):i + SLOPE_NEIGHBOURS + 1])
             for i in range(len(d1))]
    s1, s2 = _winsorized_sd(local), _winsorized_sd(d2)
    if s1 <= 0:
        return Noise(0.0, 0.0, len(d2))
    rho = min(max(3 - (s2 / s1) ** 2, 0.0), MAX_AUTOCORRELATION)
    return Noise(s1 / math.sqrt(2 * (1 - rho)), rho, len(d2), s1)


def effective_df(k: int) -> float:
    """What one run's noise estimate from k second differences is worth, in degrees of freedom (EFFECTIVE_DF)."""
    if k <= 0:
        return 0.0
    points = EFFECTIVE_DF
    if k <= points[0][0]:
        return points[0][1] * k / points[0][0]
    for (k0, d0), (k1, d1) in zip(points, points[1:], strict=False):
        if k <= k1:
            return d0 + (d1 - d0) * (k - k0) / (k1 - k0)
    return points[-1][1] * k / points[-1][0]


def pooled_noise(curves: Sequence[Sequence[float]]) -> Noise:
    """The noise of several runs of one metric: their variances averaged, weighted by their differences, and
    their autocorrelation shrunk toward 0 (RHO_PRIOR_DF); its df is what the estimate is worth (the runs'
    effective_df summed). What every verdict reads (`run_noise` is one run's raw estimate, its df a count)."""
    parts = [n for n in map(run_noise, curves) if n.df > 0]
    df = sum(n.df for n in parts)
    if df == 0:
        return Noise(0.0, 0.0, 0)
    worth = max(1, round(sum(effective_df(n.df) for n in parts)))
    # sigma from the first differences with the SHRUNK autocorrelation: with each run's raw one, one run in ten
    # read its noise 1.85x too high (simulated, white noise, 30 steps), and its tolerance with it
    rho = sum(n.df * n.rho for n in parts) / (df + RHO_PRIOR_DF)
    diff_var = sum(n.df * n.diff_sd ** 2 for n in parts) / df
    return Noise(math.sqrt(diff_var / (2 * (1 - rho))), rho, worth, math.sqrt(diff_var))


def shrunk(prior_sd: float, prior_df: int, spread: float, spread_df: int) -> tuple[float, int]:
    """(s, df): the spread across runs (`spread`, `spread_df` degrees of freedom) combined with the noise model's
    SD (`prior_sd`, worth `prior_df`, at most MAX_PRIOR_DF): s^2 = (prior_df prior_sd^2 + spread_df spread^2) /
    (prior_df + spread_df).
    Three runs that happen to agree closely cannot shrink the interval below what the noise model allows for
    long, and one run, which has no spread, is judged by the noise model alone."""
    prior_df = min(max(prior_df, 0), MAX_PRIOR_DF)
    df = prior_df + max(spread_df, 0)
    if df <= 0:
        return 0.0, 0
    return math.sqrt((prior_df * prior_sd ** 2 + max(spread_df, 0) * spread ** 2) / df), df


# ---- heavy tails: spikes are events, not noise ------------------------------------------------------------------
# Measured (issue 31): clean lab runs of unseen seeds false-alarmed 7.8 % at N=1, every one on actor/grad_norm's
# window mean, each from ONE grad-norm step of 11.6 or 8.4 against a median near 2.5; one seeded spike (x6 the
# median) in the candidate made it 40 % at N=5 (the more reference runs, the tighter the band, the surer the false
# alarm). NeMo-RL reports grad-norm spikes of 1e6-3e9 on ~20 % of steps of clean runs without R3. So a spike is
# found, counted and bounded as an event (its rate and size against the golden's runs), and replaced by the median
# of its neighbours before any band, window or trend is computed: one step can no longer move a window mean.
#
# A step is a spike when it sits more than SPIKE_Z noise SDs (the run's own, winsorized, so the spike does not set
# it) AND more than the metric's band floor away from the median of its SPIKE_NEIGHBOURS neighbours on EACH side,
# on the same side of both: a shift's first or last step agrees with one side (the first version, one median of
# both sides, called both ends of a 6-step offset spikes and hid them from the band), a monotone transient (the
# reward's first steps) lies between its sides. A run's first and last steps have one side and are never spikes.
SPIKE_Z = 6.0
SPIKE_NEIGHBOURS = 3
# The noise a spike is measured against is read from the run's first differences at most the upper bound, at this
# confidence, of the golden's (their pooled SD, chi-square with its effective df): a run's own noise is raised by its
# bursts (measured: a clean verl run's grad-norm steps of 6.5 and 5.0 around 2.3 read a sigma of 0.95 against the
# seeds' median 0.38, so neither was a spike and both entered its window mean: MISALIGNED on a clean seed). The
# bound is 1.42x the golden's for five 15-step runs (df 30), 2.6x for one (df 6). Simulated on Gaussian noise, a
# clean run's first differences exceed it in ~10 % of runs against five runs' bound, ~1 % against one's; its
# threshold is then still 6 true SDs or more, but against the 1 % of goldens whose noise reads lowest.
SPIKE_NOISE_CONFIDENCE = 0.99
# A metric is heavy-tailed when its own runs say so: a spike in one of them, or an excess kurtosis of their
# residuals from the neighbours' median above this (Gaussian noise: ~0 +- 0.9 for one 30-step run, +- 0.4 for
# five). Its window and trend then take robust centres: the TRIM-trimmed mean (as scipy.stats.trim_mean; 20 % keeps
# ~94 % of the mean's efficiency on Gaussian noise and still drops a step the spike rule let through: two of a
# 10-step window) and the Theil-Sen slope (as scipy.stats.theilslopes; ~87 % efficient, breakdown 29 %).
HEAVY_KURTOSIS = 3.0
TRIM = 0.2
# A spike larger than this many times the metric's level (the golden's median |centre|, or its noise SD or band
# floor where that is larger) fails even when the golden's runs spiked less: clean RL runs spike 3-10x their
# median (issue 31), a broken update by orders of magnitude (NeMo-RL: 1e6-3e9). A golden whose own runs spiked
# larger allows twice its largest. The default of CurveTolerance.spike_limit, which each metric may set.
SPIKE_SIZE_LIMIT = 20.0
# Spike counts follow a Poisson rate per step; the golden's k spikes in T run-steps give it a Gamma(k + 1/2, T)
# posterior (Jeffreys prior), and a candidate of t steps a negative-binomial predictive count.
SPIKE_PRIOR = 0.5


@dataclass(frozen=True)
class Spike:
    """One spike of a curve: the step's `index` in the series, its `value`, the median of its neighbours
    (`local`: what replaces it in every statistic)."""

    index: int
    value: float
    local: float

    @property
    def excess(self) -> float:
        return abs(self.value - self.local)


def _sides(values: Sequence[float], i: int) -> tuple[list[float], list[float]]:
    """The finite values among the SPIKE_NEIGHBOURS neighbours of index i before it and after it."""
    left = [v for v in values[max(0, i - SPIKE_NEIGHBOURS):i] if math.isfinite(v)]
    right = [v for v in values[i + 1:i + SPIKE_NEIGHBOURS + 1] if math.isfinite(v)]
    return left, right


def _neighbour_medians(values: Sequence[float]) -> list[float | None]:
    """Per index: the median of the finite values among its neighbours on both sides (itself left out); None
    where a side has none (a run's first and last steps)."""
    out: list[float | None] = []
    for i in range(len(values)):
        left, right = _sides(values, i)
        out.append(statistics.median(left + right) if left and right else None)
    return out


def noise_bound(sd: float, df: int, confidence: float = SPIKE_NOISE_CONFIDENCE) -> float:
    """The upper `confidence` bound of an SD estimated as `sd` with `df` degrees of freedom:
    sd sqrt(df / chi2_(1 - confidence)(df)); infinite where the estimate says nothing (no df, an SD of 0)."""
    return sd * _chi2_bound(df, confidence) if df > 0 and 0 < sd < math.inf else math.inf


@lru_cache(maxsize=256)  # a function of df alone; scipy's ppf costs ~0.1 ms
def _chi2_bound(df: int, confidence: float) -> float:
    from scipy.stats import chi2

    return math.sqrt(df / chi2.ppf(1 - confidence, df))


def find_spikes(values: Sequence[float], floor=None, diff_cap: float = math.inf) -> tuple[Spike, ...]:
    """The spikes of one curve (consecutive logged steps): finite steps more than SPIKE_Z x the run's noise SD (read
    from a first-difference SD of at most `diff_cap`: the bound of the golden's, SPIKE_NOISE_CONFIDENCE) and more
    than `floor(level)` (the metric's band floor at that level; 0 when None) beyond the median of their neighbours
    on each side, on the same side of both. Non-finite values are never spikes: they fail as themselves."""
    noise = run_noise([v for v in values if math.isfinite(v)])
    sigma = noise.sigma * min(1.0, diff_cap / noise.diff_sd) if noise.diff_sd > 0 else noise.sigma
    out = []
    for i, v in enumerate(values):
        left, right = _sides(values, i)
        if not (left and right and math.isfinite(v)):
            continue
        local = statistics.median(left + right)
        threshold = max(SPIKE_Z * sigma, floor(local) if floor else 0.0)
        dl, dr = v - statistics.median(left), v - statistics.median(right)
        if dl * dr > 0 and min(abs(dl), abs(dr)) > threshold:
            out.append(Spike(i, v, local))
    return tuple(out)


def despike(values: Sequence[float], spikes: Sequence[Spike]) -> tuple[float, ...]:
    """The curve with each spike replaced by the median of its neighbours."""
    out = list(values)
    for s in spikes:
        out[s.index] = s.local
    return tuple(out)


def heavy_tailed(curves: Sequence[Sequence[float]], floor=None, diff_cap: float = math.inf) -> bool:
    """Whether these runs of one metric are heavy-tailed, from the runs alone (never from the metric's name): a
    spike in any of them (find_spikes, with `diff_cap`), or an excess kurtosis of their residuals from their
    neighbours' median (each run's residuals in its own robust SDs, pooled) above HEAVY_KURTOSIS."""
    from scipy.stats import kurtosis  # the sample excess kurtosis (statistics has none)

    pooled: list[float] = []
    for values in curves:
        if find_spikes(values, floor, diff_cap):
            return True
        residuals = [v - m for v, m in zip(values, _neighbour_medians(values), strict=True)
                     if m is not None and math.isfinite(v)]
        if len(residuals) < 8:
            continue
        mid = statistics.median(residuals)
        mad = statistics.median(abs(r - mid) for r in residuals)
        if mad > 0:
            pooled += [(r - mid) / (MAD_TO_SD * mad) for r in residuals]
    return len(pooled) >= 8 and float(kurtosis(pooled, fisher=True, bias=False)) > HEAVY_KURTOSIS


def trimmed_mean(values: Sequence[float]) -> float:
    """The TRIM-trimmed mean: int(TRIM * n) values cut from each end, as scipy.stats.trim_mean (tests/test_curves.py
    holds the two equal); written out because scipy's argument wrapper cost ~5 ms a call, 30 % of a comparison."""
    ordered = sorted(values)
    cut = int(TRIM * len(ordered))
    return statistics.fmean(ordered[cut:len(ordered) - cut])


def theil_sen(steps: Sequence[float], values: Sequence[float]) -> float:
    """The Theil-Sen slope: the median of the pairwise slopes, as scipy.stats.theilslopes (held equal in
    tests/test_curves.py; written out for the same cost)."""
    pairs = [(values[j] - values[i]) / (steps[j] - steps[i]) for i in range(len(steps))
             for j in range(i + 1, len(steps)) if steps[j] != steps[i]]
    return statistics.median(pairs)


@lru_cache(maxsize=4096)  # a pure function of four numbers; scipy's ppf was a fifth of compare's time
def spike_allowance(golden_spikes: int, golden_steps: int, steps: int, confidence: float) -> int:
    """The most spikes a run of `steps` steps may have, at `confidence`, when the golden's runs had
    `golden_spikes` in `golden_steps` run-steps: the negative-binomial predictive quantile (Poisson rate, Jeffreys
    prior). One clean 30-step golden allows several in 30 steps (it cannot bound a rare event's rate tighter); five
    allow ~2; a golden whose runs spiked often allows as often."""
    from scipy.stats import nbinom

    if steps <= 0 or golden_steps <= 0:
        return steps
    return int(nbinom.ppf(confidence, golden_spikes + SPIKE_PRIOR, golden_steps / (golden_steps + steps)))
