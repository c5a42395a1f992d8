"""Golden baselines for curve alignment: per metric, the reference curve in Megatron's golden-values shape
(start_step, end_step, step_interval, values) plus the spread of N reference runs, the tolerances, and
provenance (hardware, versions, date, source runs).

Megatron derives its golden tolerances from repeated runs; verl's Ascend nightly compares the mean of
steps 5-14 with fixed margins. A `Baseline` carries both: with one reference run the spread is zero and
the tolerance table's floors apply; with several, the bands widen to mean +- k*std.
"""
from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import BadInput
from harness.io import read_versioned, versioned, write_json_atomic
from harness.metrics.run import Run, Series

SCHEMA = "ascend-rl-harness/baseline"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CurveTolerance:
    """How far a candidate may sit from the reference, per statistic (data, not code).

    band: per-step half-width = max(band_atol, band_rtol*|ref|, band_k*std*sqrt(1+1/n)); up to
      `max_outliers` (fraction of compared steps, at least one step) may fall outside (Megatron).
    window: `window_stat` of steps window[0]..window[1] within max(window_atol, window_rtol*|ref|, k*spread)
      (verl Ascend nightly: mean of steps 5-14, |d reward| <= 0.05).
    trend: least-squares slope over the first `trend_steps` steps within max(trend_atol, k*spread).
    """

    band_atol: float
    band_rtol: float = 0.0
    band_k: float = 4.0
    max_outliers: float = 0.1
    window: tuple[int, int] = (5, 14)
    window_stat: str = "mean"
    window_atol: float = 0.05
    window_rtol: float = 0.0
    trend_steps: int = 10
    trend_atol: float = 0.01

    def __post_init__(self):
        if self.window_stat not in ("mean", "median"):
            raise BadInput(f"tolerance window_stat {self.window_stat!r}: use mean or median")
        if self.window[0] > self.window[1] or self.trend_steps < 2:
            raise BadInput(f"tolerance window {self.window} must be (start <= end), trend_steps >= 2")


# Defaults per metric (used by `baseline record` and when comparing against raw runs). Reward: verl's
# nightly |d| <= 0.05 on the windowed mean; rollout_probs_diff: a healthy rollout matches the actor to
# float noise (~1e-7 in fp32 at tiny scale, ~1e-3 in bf16), the real faults move it by 1e-2 or more.
DEFAULT_TOLERANCES: dict[str, CurveTolerance] = {
    "critic/rewards/mean": CurveTolerance(band_atol=0.1, window_atol=0.05, trend_atol=0.01),
    "response_length/mean": CurveTolerance(band_atol=0.5, band_rtol=0.1, window_atol=0.25, window_rtol=0.05,
                                      trend_atol=0.05),
    "actor/pg_loss": CurveTolerance(band_atol=0.1, window_atol=0.05, trend_atol=0.01),
    "actor/grad_norm": CurveTolerance(band_atol=0.5, band_rtol=0.3, window_atol=0.25, window_rtol=0.15, trend_atol=0.1),
    "training/rollout_probs_diff_mean": CurveTolerance(band_atol=2e-3, band_rtol=0.05, window_atol=1e-3,
                                                  window_rtol=0.05, trend_atol=2e-4),
}
ALIGN_METRICS = tuple(DEFAULT_TOLERANCES)


def default_tolerance(metric: str) -> CurveTolerance:
    try:
        return DEFAULT_TOLERANCES[metric]
    except KeyError:
        raise BadInput(f"--metric {metric!r}: no default tolerance; known: {', '.join(DEFAULT_TOLERANCES)}") from None


def window_stat(series: Series, tol: CurveTolerance) -> float | None:
    """The windowed mean/median of `series`, None when the window has no steps."""
    values = [v for v in series.window(*tol.window).values if math.isfinite(v)]
    if not values:
        return None
    return statistics.fmean(values) if tol.window_stat == "mean" else statistics.median(values)


def slope(series: Series, tol: CurveTolerance) -> float | None:
    """Least-squares slope (per step) over the first `trend_steps` finite points; None if fewer than 2."""
    pts = [(s, v) for s, v in zip(series.steps, series.values, strict=True) if math.isfinite(v)][:tol.trend_steps]
    if len(pts) < 2:
        return None
    return statistics.linear_regression([s for s, _ in pts], [v for _, v in pts]).slope


@dataclass(frozen=True)
class MetricBaseline:
    """One metric's reference: per-step mean and std over `n_runs` runs, and each run's window/trend statistic."""

    steps: tuple[int, ...]
    center: tuple[float, ...]
    std: tuple[float, ...]
    n_runs: int
    window_values: tuple[float, ...]
    trend_values: tuple[float, ...]
    tolerance: CurveTolerance

    def to_json(self) -> dict:
        # Megatron's golden shape (start_step, end_step, step_interval, values); missing steps are null.
        start, end = self.steps[0], self.steps[-1]
        gaps = {b - a for a, b in itertools.pairwise(self.steps)}
        interval = min(gaps) if gaps else 1
        grid = list(range(start, end + 1, interval))
        by_step = dict(zip(self.steps, zip(self.center, self.std, strict=True), strict=True))
        return {"start_step": start, "end_step": end, "step_interval": interval,
                "values": [by_step[s][0] if s in by_step else None for s in grid],
                "std": [by_step[s][1] if s in by_step else None for s in grid],
                "n_runs": self.n_runs, "window_values": list(self.window_values),
                "trend_values": list(self.trend_values),
                "tolerance": {**dataclasses.asdict(self.tolerance), "window": list(self.tolerance.window)}}

    @classmethod
    def from_json(cls, doc: dict, where: str) -> MetricBaseline:
        try:
            grid = range(doc["start_step"], doc["end_step"] + 1, doc["step_interval"])
            rows = [(s, v, sd) for s, v, sd in zip(grid, doc["values"], doc["std"], strict=True) if v is not None]
            tol = dict(doc["tolerance"])
            tol["window"] = tuple(tol["window"])
            return cls(steps=tuple(s for s, _, _ in rows), center=tuple(float(v) for _, v, _ in rows),
                       std=tuple(float(sd) for _, _, sd in rows), n_runs=int(doc["n_runs"]),
                       window_values=tuple(map(float, doc["window_values"])),
                       trend_values=tuple(map(float, doc["trend_values"])), tolerance=CurveTolerance(**tol))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{where}: malformed baseline entry ({type(exc).__name__}: {exc}); "
                           "re-record it with `ascend-rl-harness baseline record`") from None

    def series(self) -> Series:
        return Series(self.steps, self.center)


@dataclass(frozen=True)
class Baseline:
    """Reference curves for several metrics plus provenance (hardware, versions, date, source runs)."""

    metrics: dict[str, MetricBaseline]
    provenance: dict = field(default_factory=dict)
    name: str = "baseline"

    @classmethod
    def from_runs(cls, runs: list[Run], metrics: tuple[str, ...] = ALIGN_METRICS,
                  tolerances: dict[str, CurveTolerance] | None = None) -> Baseline:
        """Derive a baseline from one or more reference runs (steps common to all runs)."""
        if not runs:
            raise BadInput("no reference runs given")
        tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
        out = {}
        for metric in metrics:
            have = [r for r in runs if metric in r]
            if len(have) != len(runs):
                missing = [r.name for r in runs if metric not in r]
                raise BadInput(f"reference run {missing[0]} has no metric {metric!r}; record without it "
                               "(--metric) or pass runs that log it")
            tol = tolerances.get(metric) or default_tolerance(metric)
            series = [r[metric] for r in runs]
            common = sorted(set.intersection(*(set(s.steps) for s in series)))
            if not common:
                raise BadInput(f"reference runs share no steps of {metric!r}")
            maps = [s.as_dict() for s in series]
            center, std = [], []
            for step in common:
                values = [m[step] for m in maps]
                center.append(statistics.fmean(values))
                std.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            windows = tuple(w for w in (window_stat(s, tol) for s in series) if w is not None)
            trends = tuple(t for t in (slope(s, tol) for s in series) if t is not None)
            out[metric] = MetricBaseline(steps=tuple(common), center=tuple(center), std=tuple(std), n_runs=len(runs),
                                         window_values=windows, trend_values=trends, tolerance=tol)
        first = runs[0].meta
        provenance = {"runs": [r.name for r in runs], "sources": [src for r in runs for src in r.meta.sources],
                      "scale": first.scale, "hardware": first.hardware, "devices": first.devices,
                      "versions": dict(first.versions),
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        return cls(out, provenance, name="+".join(r.name for r in runs) if len(runs) <= 3 else
                   f"{runs[0].name}+{len(runs) - 1} more")

    def to_json(self) -> dict:
        return versioned(SCHEMA, SCHEMA_VERSION, {"provenance": self.provenance,
                                                  "metrics": {m: b.to_json() for m, b in self.metrics.items()}})

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write atomically; refuse to overwrite an existing baseline unless `force`."""
        path = Path(path)
        if path.exists() and not force:
            raise BadInput(f"{path}: a baseline already exists; pass --force to replace it")
        return write_json_atomic(path, self.to_json())


def is_baseline_file(path: str | Path) -> bool:
    """True for a JSON file carrying the baseline schema key (cheap sniff of the first bytes)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".json":
        return False
    with path.open("rb") as f:
        return SCHEMA.encode() in f.read(4096)


def load_baseline(path: str | Path) -> Baseline:
    """Load a golden file; refuses unknown schema versions with a clear message."""
    path = Path(path)
    doc = read_versioned(path, schema=SCHEMA, version=SCHEMA_VERSION, what="baseline",
                         hint="re-record it with `ascend-rl-harness baseline record`",
                         missing=f"no such baseline; record one with `ascend-rl-harness baseline record RUN... "
                                 f"--out {path}`")
    metrics = {m: MetricBaseline.from_json(d, f"{path}: {m}") for m, d in doc.get("metrics", {}).items()}
    if not metrics:
        raise BadInput(f"{path}: baseline has no metrics")
    return Baseline(metrics, doc.get("provenance", {}), name=path.stem)
