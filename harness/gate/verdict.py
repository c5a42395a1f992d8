"""What changed between two stacks' reports, one verdict for it, and the bisection that names the package.

- SAFE: every test has the same outcome, and verl resolves the same algorithm config.
- CHANGED: outcomes or the resolved config differ, but nothing that passed on A fails, skips or is gone on B.
- BROKEN: a test that passed on A fails (or errors), skips or is absent on B (issue 48: the nightly's rule,
  nothing goes green by skipping, holds here too), or a side judged no test at all (all skipped or none run).

Bisection (`bisect`) looks for the smallest set of moved packages that, applied over A, reproduces B's failure of
the oracle test (the cheapest test that broke): every single package first, then pairs (verl's pins move with
transformers), and so on. A combination that cannot be built is SKIP and never counts as reproducing or not.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.report.schema import FAILING, RunReport

SAFE, CHANGED, BROKEN = "SAFE", "CHANGED", "BROKEN"
ABSENT = "<absent>"  # a config key one stack's verl does not have (a new key defaulting to null is a change)
MAX_BISECT_STEPS = 32  # oracle runs; 5 moved packages take at most 5 + 10 + 10 + 5 + 1 = 31
# Numeric test properties whose relative change is reported (throughput, start-up, memory); a 2-core host's noise
# is tens of percent, so they inform the report and never decide the verdict.
NUMERIC_CHANGE = 0.25


@dataclass
class Comparison:
    verdict: str
    broken: list[dict] = field(default_factory=list)  # passed on A, failing on B
    flipped: list[dict] = field(default_factory=list)  # every other outcome that differs
    config: list[dict] = field(default_factory=list)  # resolved verl config keys that differ
    numbers: list[dict] = field(default_factory=list)  # numeric properties that moved more than NUMERIC_CHANGE

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "broken": self.broken, "flipped": self.flipped, "config": self.config,
                "numbers": self.numbers}


def compare(a: RunReport, b: RunReport, config_a: dict, config_b: dict) -> Comparison:
    outcomes_a = {t.nodeid: t for t in a.tests}
    outcomes_b = {t.nodeid: t for t in b.tests}
    broken, flipped = [], []
    for nodeid in sorted(set(outcomes_a) | set(outcomes_b)):
        ta, tb = outcomes_a.get(nodeid), outcomes_b.get(nodeid)
        oa, ob = (ta.outcome if ta else "absent"), (tb.outcome if tb else "absent")
        if oa == ob:
            continue
        row = {"test": nodeid, "a": oa, "b": ob, "reason_b": (tb.reason if tb else "")[:300],
               "duration_s": tb.duration_s if tb else None}
        (broken if oa == "passed" else flipped).append(row)  # ob differs: failing, skipped or absent
    config = [{"key": k, "a": config_a.get(k, ABSENT), "b": config_b.get(k, ABSENT)}
              for k in sorted(set(config_a) | set(config_b)) if config_a.get(k, ABSENT) != config_b.get(k, ABSENT)]
    numbers = _numbers(outcomes_a, outcomes_b)
    verdict = BROKEN if (broken or not (judged(a) and judged(b))) else CHANGED if (flipped or config) else SAFE
    return Comparison(verdict, broken, flipped, config, numbers)


def judged(report: RunReport | None) -> int:
    """How many tests of `report` have a verdict (all but the skipped): 0 is never SAFE (`--select` of nothing)."""
    return sum(t.outcome != "skipped" for t in report.tests) if report else 0


def _numbers(a: dict, b: dict) -> list[dict]:
    out = []
    for nodeid in sorted(set(a) & set(b)):
        pa, pb = a[nodeid].properties, b[nodeid].properties
        for name in sorted(set(pa) & set(pb)):
            va, vb = pa[name], pb[name]
            if isinstance(va, bool) or isinstance(vb, bool) or not all(isinstance(v, (int, float)) for v in (va, vb)):
                continue
            if va and abs(vb - va) / abs(va) > NUMERIC_CHANGE:
                out.append({"test": nodeid, "property": name, "a": va, "b": vb, "ratio": vb / va})
    return out


def oracle_test(comparison: Comparison) -> str | None:
    """The cheapest test that broke by failing: what each bisection step runs (a skip on B fails no pytest run, so
    it cannot be an oracle)."""
    rows = sorted((r for r in comparison.broken if r["b"] in FAILING),
                  key=lambda r: (r["duration_s"] is None, r["duration_s"] or 0.0, r["test"]))
    return rows[0]["test"] if rows else None


@dataclass
class Bisection:
    packages: list[str]  # the smallest set that reproduces, [] when none did
    steps: list[dict]  # {"packages": [...], "outcome": "reproduces" | "passes" | "SKIP: why", "seconds": s}

    def to_json(self) -> dict:
        return {"packages": self.packages, "steps": self.steps}


def bisect(names: list[str], reproduces: Callable[[set[str]], tuple[bool | None, str, float]]) -> Bisection:
    """The smallest subset of `names` for which `reproduces(subset)` is True: subsets by size, singles first.
    `reproduces` returns (True / False / None for SKIP, a word on why, seconds). The full set (B itself) is known
    to reproduce and is not run again."""
    steps: list[dict] = []
    for size in range(1, len(names)):
        for subset in itertools.combinations(sorted(names), size):
            if len(steps) >= MAX_BISECT_STEPS:
                return Bisection([], steps + [{"packages": [], "outcome": f"stopped after {MAX_BISECT_STEPS} steps",
                                               "seconds": 0.0}])
            result, why, seconds = reproduces(set(subset))
            outcome = "reproduces" if result else "passes" if result is False else f"SKIP: {why}"
            steps.append({"packages": list(subset), "outcome": outcome, "seconds": round(seconds, 1)})
            if result:
                return Bisection(list(subset), steps)
    return Bisection(sorted(names), steps)  # only all of them together (or B's own failure is not reproducible)
