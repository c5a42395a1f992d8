"""Trend across stored nightly reports, with regression detection by step detection (as asv does). Pure
statistics: the store and the pages are harness.report.publish's.

Each report yields a few scalar metrics (TPS/card, pass rate, wall time, every benchmark's median).
Per metric, over the reports in time order, we fit the best single step (two constant segments, L1
cost around each segment's median: robust to one noisy night) and call it a regression when the
newest segment is worse than the one before by more than the tolerance. The right segment may be a
single report: the newest nightly being bad must be flagged the morning it happens.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.report.schema import RunReport

# Relative change beyond which a step counts (verl Ascend nightly: throughput / step time within 5%).
DEFAULT_TOLERANCE = 0.05
MIN_HISTORY = 2  # reports the left segment needs before a step can be called


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
        ran = [t for t in r.tests if t.outcome not in ("skipped", "xfailed")]
        put("pass_rate", True, i, sum(t.outcome == "passed" for t in ran) / len(ran) if ran else 1.0)
        put("duration_s", False, i, r.duration_s)
        for nodeid, doc in r.properties("throughput"):
            if isinstance(doc, dict) and isinstance(doc.get("tps_per_card"), (int, float)):
                put(f"tps_per_card[{nodeid}]", True, i, doc["tps_per_card"])
        for t in r.tests:
            if t.benchmark:
                put(f"benchmark_median_s[{t.benchmark['fullname']}]", False, i, t.benchmark["stats"]["median"])
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
        change = after / before - 1.0
        if abs(change) <= tolerance:
            continue
        worse = change < 0 if m.higher_is_better else change > 0
        index = present[k][0]
        out.append(Step(metric=m.name, index=index, before=before, after=after, change=change, regression=worse,
                        report=reports[index].name))
    return out


def regressions(reports: list[RunReport], tolerance: float = DEFAULT_TOLERANCE) -> list[Step]:
    return [s for s in find_steps(reports, tolerance) if s.regression]
