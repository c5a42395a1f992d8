"""The statistics behind curve bands, from few reference runs: a robust centre, a robust spread pooled over
neighbouring steps, and Student-t prediction intervals for one new run.

Why not mean +- k*std per step (what the harness did): with N = 1..5 reference runs the per-step std is itself
noise, and a fixed k ignores how little N tells. Measured on the tiny lab: 100 % false alarms on clean runs
with 1 reference run, 72 % with 2, 24 % with 3 (issue 14). Here:

- centre: the per-step median of the runs (N >= 3; one bad run cannot move it), the mean below 3;
- spread: residuals from the centre, pooled over the step and its `pool` neighbours on each side (per-step
  spread from 3 runs has 2 degrees of freedom; pooled over 5 steps, 10), each residual first clipped at
  CLIP_MADS robust standard deviations (1.4826 x the pooled median absolute residual), so one bad run adds at
  most a bounded amount instead of widening every band;
- a new run falls within centre +- t(df, confidence) * s * sqrt(1 + 1/N) (Student-t prediction interval;
  df = sum over the pooled steps of (runs - 1)).
Below MIN_CALIBRATED_RUNS runs there is no calibrated spread at all: callers say "uncalibrated: floors only".
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

from harness.errors import BadInput

# Fewer runs than this give no spread worth a verdict (2 runs: one difference per step).
MIN_CALIBRATED_RUNS = 3
# Residuals beyond this many robust standard deviations are clipped (Huber's winsorizing; 2.5 keeps ~98 % of a
# Gaussian residual's variance, WINSOR_VARIANCE below, and bounds what one bad run adds).
CLIP_MADS = 2.5
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
    than moving a verdict: a verdict reads a bound, never one round (issue 15, point 3)."""
    if len(numerators) != len(denominators) or len(numerators) < 2:
        raise BadInput(f"paired ratio: needs >= 2 pairs of rounds, got {len(numerators)} and {len(denominators)}")
    if not all(v > 0 and math.isfinite(v) for v in (*numerators, *denominators)):
        raise BadInput("paired ratio: every round must be a positive finite number")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators, strict=True)]
    mean, n = statistics.fmean(logs), len(logs)
    half = t_quantile(n - 1, confidence) * statistics.stdev(logs) / math.sqrt(n)
    return RatioInterval(ratio=math.exp(mean), low=math.exp(mean - half), high=math.exp(mean + half), n=n,
                         confidence=confidence)
