"""A golden's power: per judged statistic, the smallest shift it detects (its minimum detectable effect, MDE), and
whether that is small enough for the reward gain the golden's own runs show.

Issue 43: a tiny verl run whose reward stayed flat near -0.8 while the clean run climbed from -1.3 to +0.5 was
ALIGNED, 25 of 25 statistics passed: the golden's reward window allowed +-0.82, most of the reward's range. Nothing
said so when the golden was recorded. Now `baseline record` simulates, from the golden's own noise model, each
statistic's verdict on candidates shifted by d, and states the d it flags in POWER of them; a golden whose reward MDE
exceeds half its own gain is WEAK (a run that learns half as much would pass it), and the advice says what would fix
it.

The simulation: candidates are the golden's centre + a shift + AR(1) noise with the golden's autocorrelation, scaled
per statistic to the SD its verdict assumes for one new run (the prediction interval's s * sqrt(1 + 1/N): the step
noise times the calibrated inflation, shrunk with the runs' spread); each draw is judged by the verdict's own rule
(the band's edges and outlier allowance, the window's and trend's bounds with their floors; one-sided where the
metric has a better side). Level shifts for the band and window, a slope change for the trend. The draws are seeded
(POWER_SEED) and shared by every shift, so the table is deterministic and the detection rate grows with the shift.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from harness.metrics import stats
from harness.metrics.baseline import Baseline, MetricBaseline, slope, window_stat, window_steps
from harness.metrics.curves import BETTER_SIDE, edges
from harness.metrics.keys import REWARD

POWER = 0.8  # an MDE is the shift flagged in this share of simulated candidates (the usual 80 % power)
POWER_DRAWS = 1000
POWER_SEED = 43
# A golden is WEAK when its reward MDE exceeds this share of the reward gain its own runs show: issue 43's "a run
# keeping half of the golden's reward gain fails".
WEAK_SHARE = 0.5


def _ar1(rng: np.random.Generator, rho: float, draws: int, steps: int) -> np.ndarray:
    """Stationary AR(1) noise of unit SD, draws x steps."""
    z = rng.standard_normal((draws, steps))
    out = np.empty_like(z)
    out[:, 0] = z[:, 0]
    scale = math.sqrt(1 - rho * rho)
    for t in range(1, steps):
        out[:, t] = rho * out[:, t - 1] + scale * z[:, t]
    return out


def _mde(detected, scale: float) -> float:
    """The smallest shift d >= 0 with detected(d) >= POWER (bisection; `scale` is a shift of the statistic's own
    size); inf when even 1e6 x scale is not detected."""
    lo, hi = 0.0, max(scale, 1e-300)
    while detected(hi) < POWER:
        lo, hi = hi, hi * 2
        if hi > 1e6 * max(scale, 1e-300):
            return math.inf
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if detected(mid) >= POWER else (mid, hi)
        if hi - lo <= 1e-4 * hi:
            break
    return hi


def _outside(metric: str, values: np.ndarray, reference: float, bound: float, positive: bool, sign: int) -> np.ndarray:
    lo, hi = edges(metric, reference, bound, positive)
    return values < lo if sign < 0 else values > hi


def metric_mde(metric: str, ref: MetricBaseline) -> dict[str, tuple[float, str]]:
    """statistic -> (MDE, unit) of one metric's band, window and trend verdicts (statistics the golden cannot judge
    left out). Shifts go the side that fails: down for a metric with a better side (the reward), up otherwise."""
    tol = ref.tolerance
    sign = -1 if BETTER_SIDE.get(metric) == "higher" else 1
    rng = np.random.default_rng(POWER_SEED)
    n, rho = ref.n_runs, ref.noise.rho
    root = math.sqrt(1 + 1 / n)
    out: dict[str, tuple[float, str]] = {}

    # band: a level shift at every step; fails when more than the allowed steps fall outside
    centre, half = np.array(ref.band_center), np.array([ref.half_width(i) for i in range(len(ref.steps))])
    sd = np.array([s * root for s, _ in ref.spreads])
    noise = _ar1(rng, rho, POWER_DRAWS, len(ref.steps)) * sd
    allowed = max(1, math.floor(tol.max_outliers * len(ref.steps)))
    lo_hi = [edges(metric, c, h, ref.positive) for c, h in zip(centre, half, strict=True)]
    lo, hi = np.array([e[0] for e in lo_hi]), np.array([e[1] for e in lo_hi])

    def band_detected(d: float) -> float:
        values = centre + noise + sign * d
        outside = (values < lo) if sign < 0 else (values > hi)
        return float(np.mean(outside.sum(axis=1) > allowed))

    if sd.max() > 0 or half.max() > 0:
        out["band"] = (_mde(band_detected, float(np.median(half))), "")

    # window: a level shift of the window's steps
    first, last = window_steps(ref.steps[0], tol)
    m = last - first + 1
    known = ref.run_statistics(lambda s: window_stat(s, first, last, tol.window_stat, ref.heavy_tailed))
    if all(v is not None for v in known):
        reference, bound, s = _prediction(ref, known, tol.window_inflation * ref.noise.mean_sd(m))
        bound = max(tol.window_atol, tol.window_rtol * abs(reference), bound)
        draws = _ar1(rng, rho, POWER_DRAWS, m).mean(axis=1)
        draws *= s * root / (draws.std() or 1.0)  # the statistic's predicted SD for one new run
        out[f"window-{tol.window_stat}"] = (_mde(lambda d: float(np.mean(_outside(
            metric, reference + draws + sign * d, reference, bound, ref.positive, sign))), bound), "")

    # trend: a change of slope over the first trend_steps steps
    head = ref.steps[:tol.trend_steps]
    known = ref.run_statistics(lambda s: slope(s.window(head[0], head[-1]), ref.heavy_tailed)
                               if s.window(head[0], head[-1]).steps == head else None)
    if len(head) == tol.trend_steps and all(v is not None for v in known):
        reference, bound, s = _prediction(ref, known, tol.trend_inflation * ref.noise.slope_sd(head))
        bound = max(tol.trend_atol, bound)
        x = np.array(head, dtype=float) - np.mean(head)
        slopes = _ar1(rng, rho, POWER_DRAWS, len(head)) @ x / float(x @ x)
        slopes *= s * root / (slopes.std() or 1.0)
        # a slope is judged two-sided-on-edges like the window (harness.metrics.curves.trend)
        out["trend"] = (_mde(lambda d: float(np.mean(_outside(
            metric, reference + slopes + sign * d, reference, bound, False, sign))), bound), "/step")
    return out


def _prediction(ref: MetricBaseline, known: list[float], prior: float) -> tuple[float, float, float]:
    """(centre, half-width, s) of one new run's statistic, as the verdict derives them (MetricBaseline.predict)."""
    reference, s, df, _ = ref.prediction_sd(known, prior)
    return reference, stats.prediction_half_width(s, df, ref.n_runs, ref.tolerance.confidence), s


def reward_gain(ref: MetricBaseline) -> float | None:
    """The reward gain the golden's runs show: the centre's window statistic minus the centre at its first step
    (what a run that stops learning after a few steps does not gain); None when the window is not covered."""
    tol = ref.tolerance
    first, last = window_steps(ref.steps[0], tol)
    centre = ref.series()
    value = window_stat(centre, first, last, tol.window_stat)
    return None if value is None else value - centre.values[0]


def power_table(baseline: Baseline) -> dict:
    """The golden's `power` (a flat dict, stored in its JSON and rendered by the report): "METRIC STATISTIC" ->
    {metric, statistic, mde, unit} per judged statistic, plus reward_gain, weak and advice."""
    table: dict = {}
    for metric, ref in baseline.metrics.items():
        for statistic, (mde, unit) in metric_mde(metric, ref).items():
            table[f"{metric} {statistic}"] = {"metric": metric, "statistic": statistic,
                                              "mde": mde if math.isfinite(mde) else None, "unit": unit}
    reward = baseline.metrics.get(REWARD)
    gain = reward_gain(reward) if reward is not None else None
    window = next((v for k, v in table.items() if v["metric"] == REWARD and v["statistic"].startswith("window")),
                  None)
    mde = window["mde"] if window else None
    weak = gain is not None and (gain <= 0 or mde is None or mde > WEAK_SHARE * gain)
    table.update(reward_gain=gain, weak=weak, advice=_advice(baseline, gain, mde) if weak else None)
    return table


def _advice(baseline: Baseline, gain: float, mde: float | None) -> str:
    ref = baseline.metrics[REWARD]
    tol = ref.tolerance
    what = (f"its runs show no reward gain ({gain:+.3g} from the first step to the window)" if gain <= 0 else
            f"a run keeping half its reward gain passes it: the reward window's MDE "
            f"{'is unbounded' if mde is None else f'{mde:.3g}'} exceeds half the gain ({WEAK_SHARE * gain:.3g} of "
            f"{gain:.3g})")
    return (f"WEAK golden: {what}. Fixes: more reference runs (N={ref.n_runs} now: the spread across runs adds "
            f"degrees of freedom and sqrt(1 + 1/N) shrinks), more steps (a window later in training, where the gain "
            f"is larger; now the {tol.window[0]}th-{tol.window[1]}th logged steps), larger batches (prompts x samples "
            f"per step: the reward's step noise, sigma {ref.noise.sigma:.3g} x{tol.window_inflation:g} for other "
            f"seeds, falls as 1/sqrt(batch)), or a recipe whose clean seeds agree (a lower noise inflation)")


def _number(mde: float | None) -> str:
    return "unbounded" if mde is None else f"{mde:.3g}"


def lines(table: dict) -> list[str]:
    """The power table as text: one line per judged statistic, then the reward gain and the verdict."""
    out = [f"  {v['metric']} {v['statistic']}: MDE {_number(v['mde'])}{v['unit']}"
           for v in table.values() if isinstance(v, dict)]
    gain = table.get("reward_gain")
    if gain is not None:
        out.append(f"  reward gain of the golden's runs {gain:+.3g} (first step to the window): "
                   + ("WEAK" if table["weak"] else "the reward window's MDE is within half of it"))
    return out


def with_power(baseline: Baseline) -> Baseline:
    """The golden with its power table (what `baseline record` stores)."""
    return dataclasses.replace(baseline, power=power_table(baseline))
