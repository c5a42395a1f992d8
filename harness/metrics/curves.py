"""Reward-curve alignment: a candidate `Run` against a `Baseline`, per metric, three statistics.

- band: per-step |candidate - reference| within the band; a few outliers allowed (Megatron's golden-values
  check). Non-finite candidate values always fail (a NaN grad_norm is a finding, not noise).
- window: mean/median over a steady window (verl's Ascend nightly: mean of steps 5-14, |d reward| <= 0.05).
- trend: slope over the first k steps. Seed 001: after two fixes the 671B reward went -0.9 -> -0.8 in 10 steps
  while the GPU baseline reached -0.6: "still misaligned". Per-step noise hides that; the slope does not.
Each `CurveVerdict` names the statistic, where (step or window) and by how much; `plot` draws candidate vs band.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.findings import Finding
from harness.metrics.baseline import ALIGN_METRICS, Baseline, MetricBaseline, slope, window_stat
from harness.metrics.run import Run, Series


@dataclass(frozen=True)
class CurveVerdict:
    """One statistic of one metric. `passed` is None when it could not be evaluated (`detail` says why)."""

    metric: str
    statistic: str  # band | window-mean | window-median | trend | coverage
    passed: bool | None
    where: str  # "step 12", "steps 5-14", ...
    detail: str
    value: float | None = None  # the candidate's statistic (band: worst deviation)
    reference: float | None = None
    tolerance: float | None = None

    def message(self) -> str:
        state = {True: "ok", False: "FAIL", None: "skip"}[self.passed]
        return f"[{state}] {self.metric} {self.statistic} at {self.where}: {self.detail}"

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CurveAlignment:
    """All verdicts of one comparison; aligned when none failed and at least one was evaluated."""

    candidate: str
    baseline: str
    verdicts: tuple[CurveVerdict, ...]

    @property
    def failures(self) -> tuple[CurveVerdict, ...]:
        return tuple(v for v in self.verdicts if v.passed is False)

    @property
    def aligned(self) -> bool:
        return not self.failures and any(v.passed for v in self.verdicts)

    @property
    def ok(self) -> bool:
        return self.aligned

    def message(self) -> str:
        return "\n".join([self.summary(), *(v.message() for v in self.failures)])

    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding(f"curves.{v.statistic}", v.metric, v.where, v.message()) for v in self.failures)

    def summary(self) -> str:
        ok = sum(1 for v in self.verdicts if v.passed)
        skipped = sum(1 for v in self.verdicts if v.passed is None)
        return (f"{self.candidate} vs {self.baseline}: {'ALIGNED' if self.aligned else 'MISALIGNED'} "
                f"({ok} passed, {len(self.failures)} failed, {skipped} skipped)")


def _half_width(ref: MetricBaseline, i: int) -> float:
    tol = ref.tolerance
    spread = tol.band_k * ref.std[i] * math.sqrt(1 + 1 / ref.n_runs)  # prediction interval for one new run
    return max(tol.band_atol, tol.band_rtol * abs(ref.center[i]), spread)


def band(metric: str, cand: Series, ref: MetricBaseline) -> CurveVerdict:
    """Per-step band with up to max_outliers (fraction, at least 1) steps outside."""
    cmap = cand.as_dict()
    rows = [(s, cmap[s], ref.center[i], _half_width(ref, i)) for i, s in enumerate(ref.steps) if s in cmap]
    if not rows:
        return CurveVerdict(metric=metric, statistic="band", passed=None, where="-", detail="no common steps")
    outside = [(s, c, r, h) for s, c, r, h in rows if not (abs(c - r) <= h)]  # NaN/inf count as outside
    allowed = max(1, math.floor(ref.tolerance.max_outliers * len(rows)))
    nonfinite = [s for s, c, _, _ in rows if not math.isfinite(c)]
    worst = max(rows, key=lambda r: (abs(r[1] - r[2]) - r[3]) if math.isfinite(r[1]) else math.inf)
    s, c, r, h = worst
    passed = len(outside) <= allowed and not nonfinite
    excess = abs(c - r) - h
    margin = f"{excess:.3g} beyond the band" if not excess <= 0 else f"inside the band by {-excess:.3g}"
    detail = (f"{len(outside)} of {len(rows)} steps outside the band (allowed {allowed}); worst step {s}: "
              f"{c:.4g} vs {r:.4g} +- {h:.3g} ({margin})")
    if nonfinite:
        detail += f"; non-finite at steps {nonfinite[:5]}"
    return CurveVerdict(metric=metric, statistic="band", passed=passed, where=f"step {s}", detail=detail,
                        value=abs(c - r), reference=r, tolerance=h)


def _spread_tol(values: tuple[float, ...], k: float) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return k * sd * math.sqrt(1 + 1 / len(values))


def window(metric: str, cand: Series, ref: MetricBaseline, allow_partial: bool) -> CurveVerdict:
    tol = ref.tolerance
    name, where = f"window-{tol.window_stat}", f"steps {tol.window[0]}-{tol.window[1]}"
    want = [s for s in ref.steps if tol.window[0] <= s <= tol.window[1]]
    have = set(cand.window(*tol.window).steps)
    missing = [s for s in want if s not in have]
    if not want:
        return CurveVerdict(metric=metric, statistic=name, passed=None, where=where,
                            detail="the baseline has no steps in the window")
    if missing:
        detail = f"candidate lacks {len(missing)} of {len(want)} window steps (first {missing[0]})"
        return CurveVerdict(metric=metric, statistic=name, passed=None if allow_partial else False, where=where,
                            detail=detail)
    value, reference = window_stat(cand, tol), window_stat(ref.series(), tol)
    bound = max(tol.window_atol, tol.window_rtol * abs(reference), _spread_tol(ref.window_values, tol.band_k))
    if value is None:
        return CurveVerdict(metric=metric, statistic=name, passed=False, where=where,
                            detail="candidate window is all non-finite", reference=reference, tolerance=bound)
    passed = abs(value - reference) <= bound
    return CurveVerdict(metric=metric, statistic=name, passed=passed, where=where, value=value, reference=reference,
                        tolerance=bound, detail=f"{value:.4g} vs {reference:.4g}: |d| {abs(value - reference):.3g} "
                                                f"{'<=' if passed else '>'} {bound:.3g}")


def trend(metric: str, cand: Series, ref: MetricBaseline, allow_partial: bool) -> CurveVerdict:
    tol = ref.tolerance
    first = ref.steps[:tol.trend_steps]
    where = f"steps {first[0]}-{first[-1]}"
    cand_first = cand.window(first[0], first[-1])
    if len(cand_first) < len(first):
        detail = f"candidate has {len(cand_first)} of the first {len(first)} steps"
        return CurveVerdict(metric=metric, statistic="trend", passed=None if allow_partial and len(cand_first) >= 2
                            else False, where=where, detail=detail)
    value, reference = slope(cand_first, tol), slope(ref.series(), tol)
    bound = max(tol.trend_atol, _spread_tol(ref.trend_values, tol.band_k))
    if value is None or reference is None:
        return CurveVerdict(metric=metric, statistic="trend", passed=False, where=where, value=value,
                            reference=reference, tolerance=bound, detail="not enough finite points for a slope")
    passed = abs(value - reference) <= bound
    return CurveVerdict(metric=metric, statistic="trend", passed=passed, where=where, value=value,
                        reference=reference, tolerance=bound,
                        detail=f"slope {value:+.4g}/step vs {reference:+.4g}/step: |d| {abs(value - reference):.3g} "
                               f"{'<=' if passed else '>'} {bound:.3g}")


def compare(candidate: Run, baseline: Baseline, metrics: tuple[str, ...] | None = None, *,
            allow_partial: bool = False) -> CurveAlignment:
    """Align `candidate` with `baseline` on `metrics` (default: all of the baseline's alignment metrics).

    A candidate that stops before the baseline's window or trend steps fails those statistics unless
    `allow_partial` (then they are skipped, never silently passed)."""
    metrics = tuple(metrics) if metrics else tuple(m for m in ALIGN_METRICS if m in baseline.metrics) or tuple(
        baseline.metrics)
    verdicts = []
    for metric in metrics:
        if metric not in baseline.metrics:
            raise BadInput(f"--metric {metric!r}: baseline {baseline.name} has no such metric; "
                           f"it has {', '.join(baseline.metrics)}")
        ref = baseline.metrics[metric]
        if metric not in candidate:
            verdicts.append(CurveVerdict(metric=metric, statistic="coverage", passed=False, where="-",
                                         detail=f"candidate {candidate.name} does not log {metric}"))
            continue
        cand = candidate[metric]
        verdicts += [band(metric, cand, ref), window(metric, cand, ref, allow_partial),
                     trend(metric, cand, ref, allow_partial)]
    return CurveAlignment(candidate=candidate.name, baseline=baseline.name, verdicts=tuple(verdicts))


def band_series(candidate: Run, baseline: Baseline, metrics: tuple[str, ...]) -> dict:
    """JSON-ready candidate vs band per metric (for `record_property("curves.series", ...)` and plots)."""
    out = {}
    for metric in metrics:
        ref = baseline.metrics[metric]
        half = [_half_width(ref, i) for i in range(len(ref.steps))]
        cand = candidate[metric] if metric in candidate else Series((), ())
        out[metric] = {"steps": list(ref.steps), "center": list(ref.center),
                       "lo": [c - h for c, h in zip(ref.center, half, strict=True)],
                       "hi": [c + h for c, h in zip(ref.center, half, strict=True)],
                       "candidate_steps": list(cand.steps),
                       "candidate": [v if math.isfinite(v) else None for v in cand.values]}
    return out


def plot(alignment: CurveAlignment, candidate: Run, baseline: Baseline, path: str | Path) -> Path:
    """PNG: per metric, the baseline band (center +- half-width), the candidate, failing steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.io import write_atomic

    metrics = tuple(dict.fromkeys(v.metric for v in alignment.verdicts))
    data = band_series(candidate, baseline, metrics)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.6 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        d = data[metric]
        ax.fill_between(d["steps"], d["lo"], d["hi"], color="tab:blue", alpha=0.2, label="baseline band")
        ax.plot(d["steps"], d["center"], color="tab:blue", lw=1, label=f"baseline ({baseline.name})")
        ax.plot(d["candidate_steps"], [math.nan if v is None else v for v in d["candidate"]], color="tab:orange",
                lw=1.5, label=f"candidate ({candidate.name})")
        bad = [v for v in alignment.verdicts if v.metric == metric and v.passed is False]
        ax.set_title(f"{metric}: " + ("; ".join(f"{v.statistic} FAIL" for v in bad) or "aligned"),
                     color="tab:red" if bad else "black", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return write_atomic(path, buf.getvalue())
