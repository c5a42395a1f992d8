"""Reward-curve alignment: a candidate `Run` against a `Baseline`, per metric, three statistics, plus absolute
sanity limits and an exact mode for same-seed runs.

- band: per-step |candidate - centre| within the band (robust centre, spread pooled over neighbouring steps,
  Student-t prediction interval: harness.metrics.stats); a few outliers allowed (Megatron's golden-values check).
  Non-finite candidate values always fail (a NaN grad_norm is a finding, not noise).
- window: mean/median over a steady window counted from the candidate's first logged step (verl's Ascend nightly:
  mean of steps 5-14, |d reward| <= 0.05; a run resumed at step 101 is judged on 105-114).
- trend: slope over the first k logged steps. Seed 001: after two fixes the 671B reward went -0.9 -> -0.8 in 10
  steps while the GPU baseline reached -0.6: "still misaligned". Per-step noise hides that; the slope does not.
- spikes: a spike (one step far outside its neighbours: harness.metrics.stats.find_spikes) is an event, not noise:
  counted and bounded in rate and size against the golden's runs, named in the verdict, and replaced by its
  neighbours' median before the band, window and trend are taken (one grad-norm step of 11.6 among ~2.5s moved the
  window mean of clean runs into 7.8 % false alarms). Where the golden's runs are heavy-tailed (decided from them:
  a spike or a high kurtosis) the window takes a trimmed mean and the trend a Theil-Sen slope.
- sanity: absolute limits that need no baseline (NeMo-RL style), e.g. rollout_probs_diff below the precision's
  limit, a DAPO reward inside [-2, 1].
- exact: a run with the seed of one reference run must reproduce it value for value (Megatron's deterministic
  test), bit for bit on the golden's CPU kernels and within a few ULPs on another host's: the lab is
  deterministic per seed. verl's tiny CPU run is not (its async rollout batches requests as they arrive; three
  seed-0 runs here differ from step 1), so it is judged by the bands, never exactly.
Every N of reference runs is judged, one included: the tolerance comes from the runs' own step-to-step noise
(harness.metrics.stats) shrunk together with their spread across seeds where there are several, never from
silence. A statistic the candidate is too short for is "not judged" (said, never passed, never failed).
Each `CurveVerdict` names the statistic, where (step or window), by how much and what it was judged by; `plot`
draws candidate vs band.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.findings import Finding
from harness.metrics import stats
from harness.metrics.baseline import (
    ALIGN_METRICS,
    CONSTANTS_MISSING,
    EARLIER_ALGORITHM_KEYS,
    FAMILY_METRICS,
    RUN_ONLY_LAB_KEYS,
    STUCK_STEPS,
    Baseline,
    MetricBaseline,
    SanityLimit,
    algorithm_config,
    counts_clip_rests,
    default_tolerance,
    despiked,
    is_update_clip,
    longest_stretch,
    most_at_one_value,
    rest_tolerance,
    run_precision,
    run_seed,
    same_value,
    sanity_limits,
    slope,
    stretch_tolerance,
    stuck_limit,
    window_of,
    window_stat,
    window_steps,
)
from harness.metrics.keys import REWARD
from harness.metrics.run import Run, Series, Summary

ALIGNED, MISALIGNED, NOT_COMPARED = "ALIGNED", "MISALIGNED", "NOT COMPARED"
# Statistics that judge the candidate against nothing but itself or its config: they may fail a comparison, never
# carry it. A run with no step in common with the golden was ALIGNED on its sanity limits alone.
# spikes: the candidate's own events against the golden's rate, not a step compared with the reference; stuck:
# the candidate's own steps (a metric that moves is no step in common)
SELF_STATISTICS = ("sanity", "coverage", "algorithm", "liveness", "spikes", "stuck")
# Metrics judged one-sided: a candidate fails only on the side named. A reward above the golden's band is a run that
# learned faster, not a regression (NeMo-RL's nightly conditions on the reward are one-sided too: `mean(reward) >
# x`). Two-sided, clean tiny-lab seeds that found the task early failed goldens built from seeds on the slow path
# together: 2 of 190 two-seed goldens flagged more than 2 in 10 held-out seeds, every one of them on the reward's
# band or window, all above (issue 31). Every other metric (lengths, losses, norms, mismatch) has no better side.
BETTER_SIDE = {REWARD: "higher"}


@dataclass(frozen=True)
class CurveVerdict:
    """One statistic of one metric. `passed` is None when it was not judged (the candidate is too short for it,
    or the references do not cover it); `detail` says why."""

    metric: str
    statistic: str  # band | window-mean | window-median | trend | spikes | coverage | sanity | exact | stuck
    passed: bool | None
    where: str  # "step 12", "steps 5-14", ...
    detail: str
    value: float | None = None  # the candidate's statistic (band: worst deviation)
    reference: float | None = None
    tolerance: float | None = None

    def message(self) -> str:
        state = {True: "ok", False: "FAIL", None: "not judged"}[self.passed]
        return f"[{state}] {self.metric} {self.statistic} at {self.where}: {self.detail}"

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CurveAlignment:
    """All verdicts of one comparison. state: MISALIGNED when a verdict failed; ALIGNED when none failed and at
    least one passed; NOT COMPARED when nothing could be judged. `passed` is the one flag callers and JSON read
    (True only for ALIGNED). `notes` are caveats (precision or config differences, how exact mode compared)."""

    candidate: str
    baseline: str
    verdicts: tuple[CurveVerdict, ...]
    n_runs: int = 0  # reference runs behind the bands
    notes: tuple[str, ...] = ()
    against_reference: bool = True  # False: only the sanity limits were asked for (`compare RUN` without BASELINE)

    @property
    def failures(self) -> tuple[CurveVerdict, ...]:
        return tuple(v for v in self.verdicts if v.passed is False)

    @property
    def state(self) -> str:
        if self.failures:
            return MISALIGNED
        judged = [v for v in self.verdicts if v.passed and (v.statistic not in SELF_STATISTICS
                                                            or not self.against_reference)]
        return ALIGNED if judged else NOT_COMPARED

    @property
    def passed(self) -> bool:
        return self.state == ALIGNED

    ok = passed  # the CheckResult protocol's name (harness.findings), read by the suites' `expect`

    def to_json(self) -> dict:
        """The verdict as JSON: `passed` and `state` on top, agreeing with the exit code (0 iff passed)."""
        return {"passed": self.passed, "state": self.state, "candidate": self.candidate, "baseline": self.baseline,
                "n_runs": self.n_runs, "summary": self.summary(), "verdicts": [v.to_json() for v in self.verdicts],
                "notes": list(self.notes)}

    def message(self) -> str:
        return "\n".join([self.summary(), *(v.message() for v in self.failures), *self.notes])

    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding(f"curves.{v.statistic}", v.metric, v.where, v.message()) for v in self.failures)

    def summary(self) -> str:
        """One line that leads with the failures: "MISALIGNED: 2 failed (reward window-mean, ...), 9 passed,
        4 not judged (run too short)"."""
        ok = sum(1 for v in self.verdicts if v.passed)
        skipped = [v for v in self.verdicts if v.passed is None]
        failed = _some([f"{v.metric} {v.statistic}" for v in self.failures], 4)
        parts = [f"{len(self.failures)} failed" + (f" ({failed})" if failed else ""), f"{ok} passed"]
        if skipped:
            short = sum(1 for v in skipped if "too short" in v.detail)
            parts.append(f"{len(skipped)} not judged" + (f" ({short} for a run too short)" if short else ""))
        runs = f"{self.n_runs} reference run{'s' * (self.n_runs != 1)}" if self.n_runs else "no reference runs"
        return f"{self.candidate} vs {self.baseline}: {self.state}: {', '.join(parts)}; {runs}"


def band(metric: str, cand: Series, ref: MetricBaseline) -> CurveVerdict:
    """Per-step band with up to max_outliers (fraction, at least 1) steps outside."""
    cmap = cand.as_dict()
    rows = [(s, cmap[s], ref.band_center[i], ref.half_width(i)) for i, s in enumerate(ref.steps) if s in cmap]
    if not rows:
        return CurveVerdict(metric=metric, statistic="band", passed=None, where="-",
                            detail=f"no common steps (candidate {_span(cand)}, baseline {_span(ref.series())})")
    positive = ref.positive
    outside = [s for s, c, r, h in rows if not _inside(metric, c, r, h, positive)]  # NaN/inf count as outside
    allowed = max(1, math.floor(ref.tolerance.max_outliers * len(rows)))
    nonfinite = [s for s, c, _, _ in rows if not math.isfinite(c)]
    s, c, r, h = max(rows, key=lambda row: _excess(metric, *row[1:], positive) if math.isfinite(row[1]) else math.inf)
    excess = _excess(metric, c, r, h, positive)
    margin = f"{excess:.3g} beyond the band" if not excess <= 0 else f"inside the band by {-excess:.3g}"
    passed = len(outside) <= allowed and not nonfinite
    lo = edges(metric, r, h, positive)[0]
    below = f", lower edge {lo:.3g} (a positive metric's)" if not passed and c < r and lo > r - h else ""
    detail = (f"{len(outside)} of {len(rows)} steps outside the band (allowed {allowed}); worst step {s}: "
              f"{c:.4g} vs {r:.4g} +- {h:.3g}{below} ({margin})")
    if nonfinite:
        detail += f"; non-finite at steps {nonfinite[:5]}"
    detail += f"; {_judged_by(ref, ref.noise.sigma * ref.tolerance.band_inflation)}{_one_sided_note(metric)}"
    return CurveVerdict(metric=metric, statistic="band", passed=passed, where=f"step {s}", detail=detail,
                        value=abs(c - r), reference=r, tolerance=h)


# A positive metric's lower edge where its linear band would reach below half its centre (edges). Issue 31: the tiny
# golden's grad_norm band was +-3.1 around 2.1 (its clean runs' noise is 20 % of its level, inflated for other
# seeds), so it reached below 0, and a run whose advantages were 20x too small (grad_norm 0.1: Adam then takes the
# same steps, so the reward does not move) sat inside it.
def edges(metric: str, reference: float, bound: float, positive: bool = False) -> tuple[float, float]:
    """The interval a value must fall in: `reference` +- `bound`, open on the metric's better side (BETTER_SIDE).
    For a `positive` metric (a norm, a length, a gap: every reference value > 0), the lower edge is linear while it
    stays above half the centre. Below that it is reference^2 / (4 bound): continuous with the linear edge and with
    the same slope at bound = reference / 2. A band twice as wide reaches twice as low, and never reaches 0. Bands
    within half their centre keep the edges they were calibrated with."""
    lo = reference - bound
    if positive and reference > 0 and bound > reference / 2:
        lo = reference * reference / (4 * bound)
    hi = math.inf if BETTER_SIDE.get(metric) == "higher" else reference + bound
    return lo, hi


def _inside(metric: str, value: float, reference: float, bound: float, positive: bool = False) -> bool:
    """Inside `edges`; NaN is never inside."""
    return _excess(metric, value, reference, bound, positive) <= 0


def _excess(metric: str, value: float, reference: float, bound: float, positive: bool = False) -> float:
    """How far `value` lies beyond `edges` on the side it is on (negative: inside; NaN for NaN)."""
    lo, hi = edges(metric, reference, bound, positive)
    return max(lo - value, value - hi) if not math.isnan(value) else math.nan


def _one_sided_note(metric: str) -> str:
    return "; one-sided: only a lower reward fails" if metric in BETTER_SIDE else ""


def _span(series: Series) -> str:
    return f"steps {series.steps[0]}-{series.steps[-1]}" if len(series) else "no steps"


def _judged_by(ref: MetricBaseline, prior_sd: float) -> str:
    """What a tolerance was derived from, for the verdict's detail."""
    n = ref.n_runs
    across = f" shrunk with the spread across {n} runs" if n > 1 else " (1 reference run: no spread across runs)"
    return (f"judged by the runs' step noise (sigma {ref.noise.sigma:.3g}, rho {ref.noise.rho:.2f}, "
            f"x{prior_sd / ref.noise.sigma if ref.noise.sigma else 1:.2g} for other seeds){across}")


def _judged(metric: str, statistic: str, where: str, value: float, reference: float, bound: float,
            detail: str, positive: bool = False) -> CurveVerdict:
    passed = _inside(metric, value, reference, bound, positive)
    lo = edges(metric, reference, bound, positive)[0]
    if not passed and value < reference and lo > reference - bound:  # below a positive metric's lower edge
        text = f"{detail}: {value:.4g} < the lower edge {lo:.3g} (a positive metric's)"
    else:
        text = (f"{detail}: |d| {abs(value - reference):.3g} {'<=' if abs(value - reference) <= bound else '>'} "
                f"{bound:.3g}{_one_sided_note(metric)}" + (" (above: better)" if passed and
                                                           abs(value - reference) > bound else ""))
    return CurveVerdict(metric=metric, statistic=statistic, passed=passed, where=where, value=value,
                        reference=reference, tolerance=bound, detail=text)


def _unfilled(metric: str, statistic: str, where: str, detail: str) -> CurveVerdict:
    """A statistic the candidate cannot be judged on because it stops (or starts) short: not judged, said so --
    never passed, and never a failure that hides the real ones (a 3-step run read '9 passed, 11 failed' where 10
    of the 11 were 'cannot fill the window')."""
    return CurveVerdict(metric=metric, statistic=statistic, passed=None, where=where,
                        detail=f"not judged: run too short: {detail}")


def window(metric: str, cand: Series, ref: MetricBaseline) -> CurveVerdict:
    tol = ref.tolerance
    first, last = window_steps(cand.steps[0], tol)
    name, where = f"window-{tol.window_stat}", f"steps {first}-{last}"
    robust = ref.heavy_tailed
    value = window_stat(cand, first, last, tol.window_stat, robust)
    have = cand.window(first, last)
    if len(have) < last - first + 1:
        return _unfilled(metric, name, where, f"candidate logged {_span(cand)}: it cannot fill the window "
                         f"{first}-{last} (the {tol.window[0]}th-{tol.window[1]}th logged steps); it has "
                         f"{len(have)} of its {last - first + 1} steps")
    if value is None:
        return CurveVerdict(metric=metric, statistic=name, passed=False, where=where,
                            detail="candidate window holds non-finite values")
    per_run = ref.run_statistics(lambda s: window_stat(s, first, last, tol.window_stat, robust))
    known = [v for v in per_run if v is not None]
    if len(known) < len(per_run):
        return CurveVerdict(metric=metric, statistic=name, passed=None, where=where,
                            detail=f"{len(per_run) - len(known)} of {len(per_run)} reference runs do not cover steps "
                                   f"{first}-{last} (baseline {_span(ref.series())})")
    prior = tol.window_inflation * ref.noise.mean_sd(last - first + 1)
    reference, half, how = ref.predict(known, prior)
    bound = max(tol.window_atol, tol.window_rtol * abs(reference), half)
    return _judged(metric, name, where, value, reference, bound,
                   f"{value:.4g} vs {reference:.4g} ({_centre_kind(ref, 'window')}; {how})", ref.positive)


def _centre_kind(ref: MetricBaseline, statistic: str) -> str:
    """How a window or trend was taken: robust where the golden's runs are heavy-tailed; spikes always replaced."""
    if not ref.heavy_tailed:
        return "spikes replaced" if statistic == "window" else "least squares, spikes replaced"
    how = f"{stats.TRIM:.0%}-trimmed mean" if statistic == "window" else "Theil-Sen slope"
    return f"{how}: the golden's runs are heavy-tailed; spikes replaced"


def trend(metric: str, cand: Series, ref: MetricBaseline) -> CurveVerdict:
    tol = ref.tolerance
    first = cand.steps[0]
    head = Series(cand.steps[:tol.trend_steps], cand.values[:tol.trend_steps])
    last = head.steps[-1]
    where = f"steps {first}-{last}"
    if len(head) < tol.trend_steps:
        return _unfilled(metric, "trend", where, f"candidate has {len(head)} of the first {tol.trend_steps} "
                         "logged steps the slope is taken over")
    robust = ref.heavy_tailed
    value = slope(head, robust)
    per_run = ref.run_statistics(lambda s: slope(s.window(first, last), robust)
                                 if s.window(first, last).steps == head.steps else None)
    known = [v for v in per_run if v is not None]
    if len(known) < len(per_run):
        return CurveVerdict(metric=metric, statistic="trend", passed=None, where=where,
                            detail=f"{len(per_run) - len(known)} of {len(per_run)} reference runs do not log every "
                                   f"step {first}-{last} (baseline {_span(ref.series())})")
    if value is None or not all(map(math.isfinite, head.values)):
        return CurveVerdict(metric=metric, statistic="trend", passed=False, where=where, value=value,
                            detail="non-finite values in the steps the slope is taken over")
    prior = tol.trend_inflation * ref.noise.slope_sd(head.steps)
    reference, half, how = ref.predict(known, prior)
    bound = max(tol.trend_atol, half)
    return _judged(metric, "trend", where, value, reference, bound,
                   f"slope {value:+.4g}/step vs {reference:+.4g}/step ({_centre_kind(ref, 'trend')}; {how})")


def spikes(metric: str, cand: Series, found: tuple[stats.Spike, ...], ref: MetricBaseline) -> CurveVerdict:
    """The candidate's spikes (harness.metrics.stats.find_spikes) as events: their number within what the golden's
    runs' spike rate predicts for a run this long (harness.metrics.stats.spike_allowance), and the largest within
    the tolerance's spike_limit x the metric's level, or twice the golden's own largest. Every spike is named, pass
    or fail: the band, window and trend saw each replaced by its neighbours' median."""
    tol = ref.tolerance
    if len(cand) < 2 * stats.SPIKE_NEIGHBOURS + 1:  # no step has its neighbours on both sides: a zig-zag of 4 steps
        return _unfilled(metric, "spikes", _span(cand), f"{len(cand)} steps; a spike is a step against "
                         f"{stats.SPIKE_NEIGHBOURS} neighbours on each side")  # read as 2 spikes (a clean seed failed)
    golden, golden_steps = ref.spikes
    allowed = stats.spike_allowance(golden, golden_steps, len(cand), tol.confidence)
    limit = max(tol.spike_limit, 2 * ref.largest_spike)
    sizes = [s.excess / ref.level for s in found]
    largest = max(range(len(found)), key=lambda i: sizes[i], default=None)
    passed = len(found) <= allowed and (largest is None or sizes[largest] <= limit)
    shown = ", ".join(f"step {cand.steps[s.index]}: {s.value:.4g} vs {s.local:.4g} around it ({size:.2g}x the level)"
                      for s, size in list(zip(found, sizes, strict=True))[:4]) + (", ..." if len(found) > 4 else "")
    detail = (f"{len(found)} spike{'s' * (len(found) != 1)} in {len(cand)} steps" + (f" ({shown})" if found else "")
              + f"; the golden's {ref.n_runs} run{'s' * (ref.n_runs != 1)} had {golden} in {golden_steps} steps: up to "
                f"{allowed} allowed; each at most {limit:.3g}x the level {ref.level:.3g}")
    where = f"step {cand.steps[found[largest].index]}" if largest is not None else _span(cand)
    return CurveVerdict(metric=metric, statistic="spikes", passed=passed, where=where, detail=detail,
                        value=float(len(found)), reference=float(golden), tolerance=float(allowed))


def sanity(limit: SanityLimit, series: Series) -> CurveVerdict:
    """An absolute limit: at most max_outliers of the steps outside [low, high]; non-finite values fail."""
    rows = list(zip(series.steps, series.values, strict=True))
    outside = [(s, v) for s, v in rows if not (limit.low <= v <= limit.high)]
    nonfinite = [s for s, v in rows if not math.isfinite(v)]
    allowed = math.floor(limit.max_outliers * len(rows))
    passed = not nonfinite and len(outside) <= allowed
    bounds = f"[{limit.low:g}, {limit.high:g}]"
    if outside:
        s, v = max(outside, key=lambda sv: math.inf if not math.isfinite(sv[1]) else max(limit.low - sv[1],
                                                                                          sv[1] - limit.high))
        detail = f"{len(outside)} of {len(rows)} steps outside {bounds} (allowed {allowed}); worst step {s}: {v:.4g}"
        where = f"step {s}"
    else:
        detail, where = f"all {len(rows)} steps within {bounds}", _span(series)
    return CurveVerdict(metric=limit.metric, statistic="sanity", passed=passed, where=where,
                        detail=f"{detail} ({limit.source})", tolerance=limit.high)


def check_sanity(candidate: Run, precision: str | None = None, metrics: tuple[str, ...] | None = None
                 ) -> tuple[CurveVerdict, ...]:
    """The sanity limits of the candidate's precision (its own when not given) on the metrics it logs."""
    precision = precision or run_precision(candidate)
    return tuple(sanity(limit, candidate[limit.metric]) for limit in sanity_limits(precision)
                 if limit.metric in candidate and (metrics is None or limit.metric in metrics))


def _sanity_against(candidate: Run, baseline: Baseline, metrics: tuple[str, ...]) -> list[CurveVerdict]:
    """The sanity limits, but not one that every golden run breaks too: then the recipe itself puts the metric
    outside it, and the golden's band judges it (found on the multi-node rehearsal of seed 002's cann-recipes-train
    script: rollout top_p 0.9, so vLLM's processed logprobs are the truncated distribution's and the actor's the
    full one's, and rollout_probs_diff_mean sits at 0.02-0.08 on every clean run against fp32's 0.001). Said in the
    verdict, never passed."""
    precision = baseline.precision or run_precision(candidate)
    limits = {limit.metric: limit for limit in sanity_limits(precision)}
    runs = baseline.as_runs()
    out = []
    for verdict in check_sanity(candidate, precision, metrics):
        golden = [sanity(limits[verdict.metric], run[verdict.metric]) for run in runs if verdict.metric in run]
        if golden and not any(g.passed for g in golden):
            limit = limits[verdict.metric]
            verdict = CurveVerdict(metric=verdict.metric, statistic="sanity", passed=None, where=verdict.where,
                                   detail=f"not judged: every golden run breaks [{limit.low:g}, {limit.high:g}] "
                                          "too; the golden's band judges it", tolerance=verdict.tolerance)
        out.append(verdict)
    return out


UNSET = "unset"  # a lab option one side's lab did not have yet


def _notes(candidate: Run, baseline: Baseline) -> tuple[str, ...]:
    notes = []
    mine, theirs = run_precision(candidate), baseline.precision
    if mine and theirs and mine != theirs:
        notes.append(f"note: candidate precision {mine} differs from the baseline's {theirs}: rollout_probs_diff "
                     "floors and limits differ by precision; record a baseline in the candidate's precision")
    config, lab = baseline.provenance.get("config") or {}, candidate.meta.extra.get("lab")
    if config and isinstance(lab, dict):
        # both sides' keys: a graded-reward run (format_credit) against a golden recorded before the option existed
        # was judged with no note
        keys = (set(config) | set(lab)) - RUN_ONLY_LAB_KEYS
        differ = sorted(k for k in keys if lab.get(k, UNSET) != config.get(k, UNSET))
        if differ:
            notes.append(f"note: candidate config differs from the baseline's in {', '.join(differ)} "
                         f"({', '.join(f'{k} {lab.get(k, UNSET)!r} vs {config.get(k, UNSET)!r}' for k in differ[:3])})")
    return tuple(notes)


def compare(candidate: Run, baseline: Baseline, metrics: tuple[str, ...] | None = None) -> CurveAlignment:
    """Align `candidate` with `baseline` on `metrics` (default: all of the baseline's alignment metrics), plus the
    sanity limits of the baseline's precision. A candidate that stops before the window or trend steps is not
    judged on those statistics (said in the verdict, never passed)."""
    metrics = _metrics(metrics, baseline)
    family = baseline.judged(metrics)  # one false-alarm budget for every statistic compared (FAMILY_ALPHA)
    verdicts = []
    for metric in metrics:
        ref = family.metrics[metric]
        if metric not in candidate:
            verdicts.append(CurveVerdict(metric=metric, statistic="coverage", passed=False, where="-",
                                         detail=f"candidate {candidate.name} does not log {metric}"))
            continue
        raw = candidate[metric]
        cand, found = despiked(raw, ref.tolerance, ref.spike_diff_cap)  # spikes are events, judged apart
        verdicts += [band(metric, cand, ref), window(metric, cand, ref), trend(metric, cand, ref)]
        verdicts += [spikes(metric, raw, found, ref)] if ref.tolerance.spike_limit is not None else []
    frozen = liveness(candidate, baseline, metrics)
    verdicts += [frozen] if frozen else []
    verdicts += _sanity_against(candidate, baseline, metrics)
    same = algorithm(candidate, baseline)
    verdicts += [same] if same else []
    verdicts += constants(candidate, baseline)
    verdicts += stuck(candidate, baseline)
    notes = _notes(candidate, baseline) + ((CONSTANTS_MISSING,) if baseline.constants is None else ())
    if (baseline.power or {}).get("weak") is True:  # an ALIGNED against it cannot rule out a run that learns less
        notes += (f"note: the golden is WEAK: {baseline.power.get('advice')}",)
    return CurveAlignment(candidate=candidate.name, baseline=baseline.name, verdicts=tuple(verdicts),
                          n_runs=baseline.n_runs, notes=notes)


def _some(names, most: int = 6) -> str:
    """The first `most` of `names`, comma-separated, with ", ..." when there are more."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def constants(candidate: Run, baseline: Baseline) -> list[CurveVerdict]:
    """The metrics every golden run logged alike (harness.metrics.baseline.find_constants) against the candidate's,
    to float tolerance: one failing verdict per metric that differs, naming its first differing step; one verdict
    for all that match; one for those the candidate does not log or shares no step of (not judged: a console log
    or a wandb export may carry fewer keys). A metric with one value in the golden is checked at every step the
    candidate logged (a run resumed at step 101 included), a schedule at the steps both logged."""
    verdicts, same, unjudged = [], [], []
    for metric, ref in (baseline.constants or {}).items():
        cand = candidate.series.get(metric)
        single = len(set(ref.values)) == 1
        expected = ref.as_dict()
        pairs = [] if cand is None else [
            (t, v, ref.values[0] if single else expected[t]) for t, v in zip(cand.steps, cand.values, strict=True)
            if single or t in expected]
        if not pairs:
            unjudged.append(metric)
            continue
        differ = [(t, v, r) for t, v, r in pairs if not same_value(v, r)]  # NaN never equals
        if not differ:
            same.append(metric)
            continue
        t, v, r = differ[0]
        what = f"{r:.9g} at every step" if single else f"a schedule, {r:.9g} at step {t}"
        verdicts.append(CurveVerdict(
            metric=metric, statistic="constant", passed=False, where=f"step {t}", value=v, reference=r,
            detail=f"{v:.9g} vs the golden's {r:.9g} at step {t}, the first of {len(differ)} of {len(pairs)} steps "
                   f"that differ; every golden run logged {what}"))
    if same:
        verdicts.append(CurveVerdict(metric="constants", statistic="constant", passed=True, where="every step",
                                     detail=f"{len(same)} metrics equal the golden's at every step: {_some(same)}"))
    if unjudged:
        verdicts.append(CurveVerdict(metric="constants", statistic="constant", passed=None, where="-",
                                     detail=f"not judged: the candidate logs no step of {len(unjudged)} of the "
                                            f"golden's constant metrics: {_some(unjudged)}"))
    return verdicts


def stuck(candidate: Run, baseline: Baseline) -> list[CurveVerdict]:
    """The metrics the golden's runs move (harness.metrics.baseline.find_moving) against the candidate's, at the steps
    the golden covers (a longer run may converge later, every group solved and nothing left to learn): one failing
    verdict per metric the candidate holds at one value (to float rounding; a rest at the golden's extremes or a share's
    bounds aside: harness.metrics.baseline.rest_bounds) for stuck_limit steps in a row or more, or at stuck_limit of the
    reward window's steps, in a row or not, against the most any golden run held one value there
    (harness.metrics.baseline.window_of; a trainer that skips its update at every other step: issue 43's
    quarter-updates; most_at_one_value says why the window; the update's clip fraction at 0 counts there: issue 43's
    damped-updates, rest_bounds; its limit reads the median golden run's count too: stuck_limit), naming the value
    and the steps; one verdict for all that move; one, not judged, for those logged at fewer than STUCK_STEPS of those
    steps; one saying a golden recorded before the count judges stretches only."""
    verdicts, moving, short, uncounted = [], [], [], []
    last = max((b.steps[-1] for b in baseline.metrics.values() if b.steps), default=0)
    rest = rest_tolerance(baseline.metrics)
    for metric, (low, high, longest, most, typical) in baseline.moving.items():
        cand = candidate.series.get(metric)
        if cand is None:
            continue
        pairs = [(t, v) for t, v in zip(cand.steps, cand.values, strict=True) if t <= last]
        if len(pairs) < STUCK_STEPS:
            short.append(metric)
            continue
        steps, values = [t for t, _ in pairs], [v for _, v in pairs]
        first, length = longest_stretch(steps, values, metric, low, high)
        limit = stuck_limit(longest, len(steps))  # a third of the steps judged
        start, end = window_of(candidate, metric, rest)
        if most is None:
            uncounted.append(metric)
            found = None
        else:
            found = most_at_one_value(steps, values, metric, low, high, start, end,
                                      clip_rests=counts_clip_rests(rest))
        # the update's clip fraction at 0 has its own limit (stuck_limit), from its recipe's calibrated share of the
        # window (CurveTolerance.rest_share) where it has one
        share = baseline.metrics[metric].tolerance.rest_share if metric in baseline.metrics else None
        clipped_none = bool(found and found[0]) and is_update_clip(metric, low, high) and abs(
            values[found[0][0]]) <= stretch_tolerance(low, high)
        if length >= limit:
            value, stretch = values[first], steps[first:first + length]
            held = "moved it at every step" if longest == 1 else f"held one value at most {longest} steps in a row"
            verdicts.append(CurveVerdict(
                metric=metric, statistic="stuck", passed=False, where=f"steps {stretch[0]}-{stretch[-1]}",
                value=value, detail=f"{value:.9g} at each of {length} steps in a row ({stretch[0]}-{stretch[-1]}; "
                                    f"{limit} fail); every golden run {held} ({low:.3g} to {high:.3g}): a part of "
                                    "the trainer stopped"))
        elif found and len(found[0]) >= (count_limit := stuck_limit(most, found[1], clipped_none, typical, share)):
            rests = found[0]
            value = values[rests[0]]
            held = "moved it at every step there" if most == 1 else f"held one value at most {most} of them"
            if clipped_none and typical is not None and most > 1:
                held += f", the median run {typical:g}"
            why = ("the update moved no token's ratio past the clip there: the policy barely moved (a damped, "
                   "skipped or frozen update, or no gradient)"
                   if clipped_none else "a part of the trainer stops at some steps")
            verdicts.append(CurveVerdict(
                metric=metric, statistic="stuck", passed=False, where=f"{len(rests)} of steps {start}-{end}",
                value=value, detail=f"{value:.9g} at {len(rests)} of the {found[1]} steps it logged in {start}-{end}, "
                                    f"the window ({_some([str(steps[i]) for i in rests])}; {count_limit} fail); "
                                    f"every golden run {held} ({low:.3g} to {high:.3g}): {why}"))
        else:
            moving.append(metric)
    if moving:
        verdicts.append(CurveVerdict(metric="moving", statistic="stuck", passed=True, where="every step",
                                     detail=f"{len(moving)} metrics the golden's runs move, move: {_some(moving)}"))
    if short:
        verdicts.append(CurveVerdict(metric="moving", statistic="stuck", passed=None, where="-",
                                     detail=f"not judged: run too short: {len(short)} metrics the golden's runs move "
                                            f"have fewer than {STUCK_STEPS} of the golden's steps"))
    if uncounted:
        verdicts.append(CurveVerdict(metric="moving", statistic="stuck", passed=None, where="-",
                                     detail=f"not judged: repeats of one value in the window, in a row or not: "
                                            f"the golden predates their count or logs too few of its steps "
                                            f"({len(uncounted)} metrics judged on stretches in a row only: "
                                            f"{_some(uncounted)}); re-record it"))
    return verdicts


def liveness(candidate: Run, baseline: Baseline, metrics: tuple[str, ...]) -> CurveVerdict | None:
    """A failing verdict when every compared metric of the candidate is constant over its steps while the golden's
    are not: a run that logged one value per metric throughout (a frozen logger, a stuck job replaying a step)
    trains nothing, yet sat inside wide bands and was ALIGNED with no word. None when the candidate moves or the
    golden is itself flat."""
    logged = [m for m in metrics if m in candidate and len(candidate[m].values) >= 3]
    if len(logged) < 2:
        return None
    flat = [m for m in logged if len(set(candidate[m].values)) == 1]
    golden_moves = any(len(set(baseline.metrics[m].center)) > 1 for m in logged)
    if len(flat) < len(logged) or not golden_moves:
        return None
    steps = len(candidate[logged[0]].values)
    return CurveVerdict(metric="run", statistic="liveness", passed=False, where=f"{steps} steps",
                        detail=f"every compared metric ({_some(logged, 4)}) "
                               f"is constant over {steps} steps while the golden's move: the run trains nothing")


def algorithm(candidate: Run, baseline: Baseline) -> CurveVerdict | None:
    """The candidate trains the golden's algorithm (harness.metrics.baseline.ALGORITHM_KEYS in verl's resolved
    configs); None when either side recorded none (a lab run, a log without its Hydra directory). The settings
    judged are the ALGORITHM_KEYS the golden was recorded under (its "algorithm_keys"): a setting either side lacks
    among them differs, and a key added to ALGORITHM_KEYS since is not held against an older golden."""
    theirs, mine = baseline.provenance.get("algorithm"), algorithm_config(candidate)
    if not isinstance(theirs, dict) or not theirs or mine is None:
        return None
    judged = baseline.provenance.get("algorithm_keys") or EARLIER_ALGORITHM_KEYS
    differ = sorted(k for k in judged if theirs.get(k) != mine.get(k))
    shown = "; ".join(f"{k} {mine.get(k)!r} vs the golden's {theirs.get(k)!r}" for k in differ[:4])
    return CurveVerdict(metric="config", statistic="algorithm", passed=not differ, where="verl config",
                        detail=(f"{len(differ)} algorithm setting(s) differ from the golden's {len(theirs)}: {shown}"
                                if differ else
                                f"all {len(theirs)} algorithm settings equal the golden's"))


def _metrics(metrics: tuple[str, ...] | None, baseline: Baseline) -> tuple[str, ...]:
    metrics = tuple(metrics) if metrics else tuple(m for m in FAMILY_METRICS if m in baseline.metrics) or tuple(
        baseline.metrics)
    for metric in metrics:
        if metric not in baseline.metrics:
            raise BadInput(f"--metric {metric!r}: baseline {baseline.name} has no such metric; "
                           f"it has {', '.join(baseline.metrics)}")
    return metrics


# Same seed, another CPU host: the kernels differ in the last bits (AVX2 / AVX-512 / AMX paths of ATen, oneDNN,
# MKL), and a few RL steps carry the difference forward. Measured: a lab golden from a host without AMX reproduces
# on an AMX host to |d| 3e-8 (pg_loss ~0.26) and 1.2e-7 (grad_norm ~0.7) after 1 step. rtol 1e-5 is ~100 fp32 ULPs
# of slack; atol 1e-6 covers metrics that are themselves float noise (rollout_probs_diff ~1e-9..1e-7 in fp32,
# while every seeded rollout fault moves it to >= 1e-4).
CROSS_HOST_RTOL, CROSS_HOST_ATOL = 1e-5, 1e-6


def compare_exact(candidate: Run, baseline: Baseline, metrics: tuple[str, ...] | None = None, *,
                  allow_partial: bool = False) -> CurveAlignment:
    """Same-seed exact mode (Megatron's deterministic test): the candidate must reproduce, value for value, the
    reference run of its own seed on every step that run logged (`allow_partial`: on the steps the candidate
    logged, a shorter run). Bit for bit only where both were computed with the same CPU kernels (the host
    fingerprints of the candidate's meta.json and the golden agree: harness.config.host.same_kernels); elsewhere
    within CROSS_HOST_RTOL / CROSS_HOST_ATOL, and the verdict says which and why. Refuses when the seed is unknown
    or absent."""
    from harness.config import host

    seed = run_seed(candidate)
    if seed is None:
        raise BadInput(f"run {candidate.name}: its meta.json records no seed; exact mode compares same-seed runs")
    metrics = _metrics(metrics, baseline)
    mine, theirs = candidate.meta.extra.get("host"), baseline.provenance.get("host")
    same_host = host.same_kernels(mine, theirs)
    tolerance = None if same_host else (CROSS_HOST_RTOL, CROSS_HOST_ATOL)
    verdicts = []
    for metric in metrics:
        ref = next((r for r in baseline.metrics[metric].runs if r.seed == seed), None)
        if ref is None:
            seeds = sorted({r.seed for r in baseline.metrics[metric].runs if r.seed is not None})
            raise BadInput(f"--exact: baseline {baseline.name} has no run of seed {seed} (it has seeds {seeds})")
        if metric not in candidate:
            verdicts.append(CurveVerdict(metric=metric, statistic="exact", passed=False, where="-",
                                         detail=f"candidate {candidate.name} does not log {metric}"))
            continue
        series = ref.series
        if allow_partial:  # a shorter run: the reference's steps up to the candidate's last
            series = series.window(series.steps[0], candidate[metric].steps[-1])
        verdicts.append(exact(metric, candidate[metric], series, ref.name, tolerance))
    how = ("bit for bit: same CPU kernels" if same_host else
           f"within rtol {CROSS_HOST_RTOL:g} / atol {CROSS_HOST_ATOL:g}, not bit for bit: the hosts' kernels differ "
           f"({host.differences(mine, theirs)})")
    return CurveAlignment(candidate=candidate.name, baseline=f"{baseline.name} seed {seed}", verdicts=tuple(verdicts),
                          n_runs=1, notes=(f"note: exact mode compared {how}",))


def exact(metric: str, cand: Series, ref: Series, ref_name: str,
          tolerance: tuple[float, float] | None = None) -> CurveVerdict:
    """Equality of the values on every step of `ref`, bitwise, or within (rtol, atol) `tolerance` (another host's
    kernels); names the first divergent step."""
    cmap = cand.as_dict()
    missing = [s for s in ref.steps if s not in cmap]
    if missing:
        return CurveVerdict(metric=metric, statistic="exact", passed=False, where=f"step {missing[0]}",
                            detail=f"candidate lacks {len(missing)} of the {len(ref)} steps of {ref_name} "
                                   f"(first {missing[0]})")
    rtol, atol = tolerance or (0.0, 0.0)

    def same(c: float, v: float) -> bool:
        return c == v if tolerance is None else abs(c - v) <= atol + rtol * abs(v)  # NaN never passes

    diverged = [(s, cmap[s], v) for s, v in zip(ref.steps, ref.values, strict=True) if not same(cmap[s], v)]
    how = "exactly" if tolerance is None else f"within rtol {rtol:g} / atol {atol:g}"
    if not diverged:
        return CurveVerdict(metric=metric, statistic="exact", passed=True, where=_span(ref),
                            detail=f"all {len(ref)} steps equal {ref_name}'s {how}", tolerance=atol)
    s, c, v = diverged[0]
    return CurveVerdict(metric=metric, statistic="exact", passed=False, where=f"step {s}", value=c, reference=v,
                        tolerance=atol, detail=f"{len(diverged)} of {len(ref)} steps differ from {ref_name} ({how}); "
                                               f"first divergent step {s}: {c!r} vs {v!r} (|d| {abs(c - v):.3g})")


def compare_summary(candidate: Run, summary: Summary, metrics: tuple[str, ...] | None = None) -> CurveAlignment:
    """Against verl's Ascend nightly baseline summary (`key: value`, the mean of steps 5-14): the candidate's
    windowed mean over the same window, judged as verl's nightly judges it -- by the metric's window tolerance
    (|d reward| <= 0.05; harness.metrics.baseline DEFAULT_TOLERANCES) -- widened by the candidate's own step noise
    (its window mean is one draw); a summary holds no spread to estimate more from. Sanity limits still apply."""
    wanted = tuple(metrics) if metrics else tuple(m for m in ALIGN_METRICS if m in summary)
    missing = [m for m in wanted if m not in summary]
    if missing or not wanted:
        raise BadInput(f"{summary.source}: the summary has no {missing[0] if missing else 'alignment metric'}; it has "
                       f"{', '.join(sorted(summary.values)[:8])}")
    verdicts = []
    for metric in wanted:
        if metric not in candidate:
            verdicts.append(CurveVerdict(metric=metric, statistic="coverage", passed=False, where="-",
                                         detail=f"candidate {candidate.name} does not log {metric}"))
            continue
        cand, tol = candidate[metric], default_tolerance(metric, run_precision(candidate))
        first = cand.steps[0] + summary.window[0] - 1
        last = cand.steps[0] + summary.window[1] - 1
        value, where = window_stat(cand, first, last, "mean"), f"steps {first}-{last}"
        if value is None:
            verdicts.append(_unfilled(metric, "window-mean", where, f"candidate logged {_span(cand)}: it cannot fill "
                                      f"{summary.statistic} at steps {first}-{last}"))
            continue
        reference = summary.values[metric]
        noise = stats.pooled_noise([cand.values])
        half = stats.t_quantile(max(noise.df, 1), tol.confidence) * tol.window_inflation * noise.mean_sd(
            last - first + 1) if noise.df else 0.0
        bound = max(tol.window_atol, tol.window_rtol * abs(reference), half)
        verdicts.append(_judged(metric, "window-mean", where, value, reference, bound,
                                f"{value:.4g} vs {reference:.4g} ({summary.statistic}; judged by verl's nightly "
                                f"tolerance and the candidate's step noise)"))
    verdicts += check_sanity(candidate, metrics=wanted)
    return CurveAlignment(candidate=candidate.name, baseline=summary.name, verdicts=tuple(verdicts), n_runs=1)


@dataclass(frozen=True)
class SelfCheck:
    """Leave-one-out check of a baseline's own runs: each compared with the band of the others. The fraction
    flagged estimates the golden's false-alarm rate on clean runs; a flagged run disagrees with the others."""

    runs: tuple[str, ...]
    flagged: tuple[tuple[str, str], ...]  # (run, first failure)

    @property
    def false_alarm_rate(self) -> float:
        return len(self.flagged) / len(self.runs) if self.runs else 0.0

    def to_json(self) -> dict:
        return {"runs": len(self.runs), "flagged": [{"run": r, "failure": f} for r, f in self.flagged],
                "false_alarm_rate": self.false_alarm_rate,
                "method": "leave-one-out: each run against the band of the others"}


def self_check(baseline: Baseline, runs: list[Run]) -> SelfCheck | None:
    """Leave-one-out over the baseline's runs (the Runs it was built from, same order); None below 3 runs. Each
    left-out run is judged against the others as any candidate is."""
    if len(runs) < stats.MIN_CALIBRATED_RUNS:
        return None
    flagged = []
    for i, run in enumerate(runs):
        alignment = compare(run, baseline.without(i), tuple(baseline.metrics))
        if alignment.failures:
            flagged.append((run.name, alignment.failures[0].message()))
    return SelfCheck(runs=tuple(r.name for r in runs), flagged=tuple(flagged))


# What a report keeps of the golden's own runs per metric (drawn as thin lines, exported to TensorBoard / CSV): a
# golden of 5 runs x 15 steps is kept whole; one of 64 runs x 10k steps would make every nightly report ~50 MB.
MAX_REFERENCE_RUNS = 16
MAX_REFERENCE_POINTS = 1000


def _thinned(series: Series, limit: int = MAX_REFERENCE_POINTS) -> Series:
    """At most `limit` points of `series`, evenly strided, the last step always kept (a plot 720 px wide shows no
    more; the band's statistics are computed from the whole curve, never from this)."""
    if len(series) <= limit:
        return series
    keep = sorted({round(i * (len(series) - 1) / (limit - 1)) for i in range(limit)})
    return Series(tuple(series.steps[i] for i in keep), tuple(series.values[i] for i in keep))


def reference_runs(ref: MetricBaseline) -> list[dict]:
    """The golden's runs of one metric as the report keeps them: {name, seed, steps, values}, the first
    MAX_REFERENCE_RUNS runs, each thinned to MAX_REFERENCE_POINTS points."""
    return [{"name": r.name, "seed": r.seed, "steps": list(t.steps), "values": list(t.values)}
            for r in ref.runs[:MAX_REFERENCE_RUNS] for t in (_thinned(r.series),)]


def band_series(candidate: Run, baseline: Baseline, metrics: tuple[str, ...],
                alignment: CurveAlignment | None = None) -> dict:
    """JSON-ready candidate vs band per metric (for `record_property("curves.series", ...)` and plots):
    {metric: {steps, center, lo, hi, candidate_steps, candidate, candidate_name, baseline_name, outside_steps,
    verdict, reference_runs, n_reference_runs}}. `candidate_name` / `baseline_name` are what plots label the curves
    with (CLI plot and report alike); `outside_steps` are the candidate's steps outside the band; `verdict` is "ok",
    "FAIL: band, trend", or "not judged" (from `alignment` when given); `reference_runs` the golden's own curves
    (at most MAX_REFERENCE_RUNS, each thinned), `n_reference_runs` how many the golden has."""
    out = {}
    family = baseline.judged(metrics)  # the bands the verdicts judged by
    for metric in metrics:
        ref = family.metrics[metric]
        half = [ref.half_width(i) for i in range(len(ref.steps))]
        cand = candidate[metric] if metric in candidate else Series((), ())
        cmap = despiked(cand, ref.tolerance, ref.spike_diff_cap)[0].as_dict()  # what the band verdict judged
        outside = [s for s, c, h in zip(ref.steps, ref.band_center, half, strict=True)
                   if s in cmap and not _inside(metric, cmap[s], c, h, ref.positive)]
        out[metric] = {"steps": list(ref.steps), "center": list(ref.band_center),
                       "lo": [edges(metric, c, h, ref.positive)[0] for c, h in zip(ref.band_center, half,
                                                                                   strict=True)],
                       "hi": [c + h for c, h in zip(ref.band_center, half, strict=True)],
                       "candidate_steps": list(cand.steps),
                       "candidate": [v if math.isfinite(v) else None for v in cand.values],
                       "candidate_name": candidate.name, "baseline_name": f"{baseline.name} ({ref.n_runs} runs)",
                       "outside_steps": outside,
                       "verdict": _panel_verdict(alignment, metric) if alignment else None,
                       "reference_runs": reference_runs(ref), "n_reference_runs": ref.n_runs}
    return out


def _panel_verdict(alignment: CurveAlignment, metric: str) -> str:
    mine = [v for v in alignment.verdicts if v.metric == metric]
    failed = [v.statistic for v in mine if v.passed is False]
    if failed:
        return "FAIL: " + ", ".join(failed)
    return "ok" if any(v.passed for v in mine) else "not judged"


def _tex_safe(text: str) -> str:
    """Matplotlib parses $...$ in labels as mathtext: a metric named `$\\undefinedcmd$` would crash the plot."""
    return text.replace("$", r"\$")


def plot(alignment: CurveAlignment, candidate: Run, baseline: Baseline, path: str | Path) -> Path:
    """PNG: one panel per metric, failing metrics first; the baseline band and centre, the candidate, its
    out-of-band steps marked; axis labels; the overall verdict as the title."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.io import write_atomic

    metrics = [m for m in dict.fromkeys(v.metric for v in alignment.verdicts) if m in baseline.metrics]
    data = band_series(candidate, baseline, tuple(metrics), alignment)
    rank = {"FAIL": 0, "not judged": 1, "ok": 2}
    metrics.sort(key=lambda m: rank[data[m]["verdict"].split(":")[0]])
    fig, axes = plt.subplots(max(1, len(metrics)), 1, figsize=(8, 2.8 * max(1, len(metrics))), squeeze=False,
                             layout="constrained")
    for ax, metric in zip(axes[:, 0], metrics, strict=False):
        d = data[metric]
        ax.fill_between(d["steps"], d["lo"], d["hi"], color="tab:blue", alpha=0.2, label="band")
        ax.plot(d["steps"], d["center"], color="tab:blue", lw=1, label=_tex_safe(d["baseline_name"]))
        ax.plot(d["candidate_steps"], [math.nan if v is None else v for v in d["candidate"]], color="tab:orange",
                lw=1.5, label=_tex_safe(d["candidate_name"]))
        cmap = dict(zip(d["candidate_steps"], d["candidate"], strict=True))
        bad = [s for s in d["outside_steps"] if cmap.get(s) is not None]
        if bad:
            ax.scatter(bad, [cmap[s] for s in bad], marker="x", color="tab:red", zorder=3, label="outside the band")
        failing = d["verdict"].startswith("FAIL")
        ax.set_title(_tex_safe(f"{metric}: {d['verdict']}"), color="tab:red" if failing else "black", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(_tex_safe(metric), fontsize=7)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(_tex_safe(alignment.summary()), fontsize=9, color="tab:red" if not alignment.passed else "black")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return write_atomic(path, buf.getvalue())
