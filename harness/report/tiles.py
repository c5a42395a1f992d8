"""The night in one row: the tiles under the report's badge, each a verdict colour, its number, a sparkline of the
last nights and a link to its section.

Why: a green page showed no number at all in a laptop's first screen (1366 x 768); curve alignment first appeared
at y = 2,224 px, weight sync at 5,906, MLA freshness -- the headline check -- only in collapsed raw JSON, and memory
nowhere (newcomer review, round 5). Every tile is drawn, measured or not ("not measured" says which), so the first
screen always has the same five places to look.

A tile reads only the report's recorded properties (harness.report.schema names them) and computes no verdict of
its own: it counts the verdicts the suites recorded. `value` is the number the sparkline draws across nights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.report.schema import RunReport, finite

SPARK_W, SPARK_H = 96, 22  # px of a sparkline
SPARK_NIGHTS = 14  # the last nights drawn


@dataclass(frozen=True)
class Tile:
    key: str
    title: str
    state: str  # ok | FAIL | skipped (a CSS class of page.CSS)
    number: str  # the headline figure
    detail: str  # one line under it
    anchor: str  # id of the section the tile links to
    value: float | None = None  # what the sparkline draws for this night

    @property
    def verdict(self) -> str:
        return {"ok": "PASS", "FAIL": "FAIL"}.get(self.state, "not measured")


def _docs(report: RunReport, name: str) -> list[dict]:
    return [v for _, v in report.properties(name) if isinstance(v, dict)]


def _listed(report: RunReport, name: str) -> list[dict]:
    return [x for _, v in report.properties(name) for x in (v if isinstance(v, list) else [v]) if isinstance(x, dict)]


def weight_sync(report: RunReport) -> Tile:
    """MLA freshness (every sync of `mla.freshness`: the absorbed W_UK_T/W_UV derived from the synced kv_b_proj) and
    the timed syncs' phases against their platform budget (harness.report.sync_phases)."""
    from harness.report.sync_phases import sync_verdicts

    syncs = [s for d in _docs(report, "mla.freshness") for s in d.get("syncs") or () if isinstance(s, dict)]
    stale = sum(s.get("freshness_ok") is False for s in syncs)
    timed = [v for v in sync_verdicts(report) if v.budget]
    late = [v for v in timed if v.late]
    ratios = [(v.phases[p] / b, p, v.phases[p]) for v in timed for p, b in v.budget.items()
              if p in v.phases and b > 0]
    worst = max(ratios, default=None)
    if not syncs and not timed:
        return Tile("sync", "Weight sync + MLA freshness", "skipped", "not measured", "no sync recorded",
                    "sec-weight-sync-phases")
    parts = [f"{len(timed) - len(late)}/{len(timed)} syncs in budget"] if timed else []
    if worst:
        parts.append(f"worst {worst[1]} {1000 * worst[2]:.0f} ms ({worst[0]:.0%} of budget)")
    number = f"{len(syncs) - stale}/{len(syncs)} fresh" if syncs else f"{len(timed) - len(late)}/{len(timed)}"
    judged = len(syncs) + len(timed)
    detail = "; ".join(parts) if parts else (f"{stale} stale" if stale else "every sync fresh")
    return Tile("sync", "Weight sync + MLA freshness", "FAIL" if stale or late else "ok", number, detail,
                "sec-weight-sync-phases", (judged - stale - len(late)) / judged)


def curves(report: RunReport) -> Tile:
    """The curve verdicts against the golden: how many statistics failed of those judged, the golden's number of
    reference runs, and its minimum detectable effect on the reward window where the golden states one (its
    `power` table, recorded as the `curves.power` property)."""
    verdicts = _listed(report, "curves.verdicts")
    judged = [v for v in verdicts if v.get("passed") in (True, False)]
    failed = [v for v in judged if v.get("passed") is False]
    runs = max((s.get("n_reference_runs") or len(s.get("reference_runs") or ()) for d in
                _docs(report, "curves.series") for s in d.values() if isinstance(s, dict)), default=0)
    if not judged:
        return Tile("curves", "Curves vs golden", "skipped", "not judged" if verdicts else "not measured",
                    f"{len(verdicts)} statistics, none judged" if verdicts else "no curve recorded", "sec-curves")
    detail = f"{len(failed)} of {len(judged)} statistics failed" + (f" vs the {runs}-run golden" if runs else "")
    for power in _docs(report, "curves.power"):
        reward = next((v for v in power.values() if isinstance(v, dict) and str(v.get("statistic", "")).startswith(
            "window") and "reward" in str(v.get("metric", ""))), None)
        if power.get("weak"):
            detail += "; WEAK golden"
        elif reward is not None and finite(reward.get("mde")):
            detail += f"; detects a reward shift of {reward['mde']:.3g}{reward.get('unit') or ''}"
    return Tile("curves", "Curves vs golden", "FAIL" if failed else "ok",
                "ALIGNED" if not failed else f"{len(failed)} FAILED", detail, "sec-curves",
                1 - len(failed) / len(judged))


def memory(report: RunReport) -> Tile:
    """The worst phase's peak against its budget (scales the memory model covers; none at tiny)."""
    phases = [p for p in _listed(report, "memory.phases") if finite(p.get("peak_gib")) and finite(p.get("budget_gib"))
              and p["budget_gib"] > 0]
    if not phases:
        return Tile("memory", "Memory", "skipped", "n/a", f"no memory model at {report.scale or 'this scale'}",
                    "sec-memory-per-phase")
    worst = max(phases, key=lambda p: p["peak_gib"] / p["budget_gib"])
    over = [p for p in phases if p.get("fits") is False or p["peak_gib"] > p["budget_gib"]]
    return Tile("memory", "Memory", "FAIL" if over else "ok",
                f"{worst['peak_gib']:.1f} / {worst['budget_gib']:.0f} GiB",
                f"worst phase {worst.get('phase', '?')}; {len(phases) - len(over)}/{len(phases)} phases fit",
                "sec-memory-per-phase", worst["peak_gib"] / worst["budget_gib"])


def _tps(report: RunReport | None) -> tuple[float, float | None] | None:
    for doc in _docs(report, "throughput") if report is not None else ():
        if finite(doc.get("tps_per_card")):
            return doc["tps_per_card"], doc.get("target") if finite(doc.get("target")) else None
    return None


def throughput(report: RunReport, previous: RunReport | None = None) -> Tile:
    """TPS/card against the scale's target and against the previous night."""
    found = _tps(report)
    if found is None:
        return Tile("throughput", "Throughput", "skipped", "not measured", "no TPS/card recorded", "sec-throughput")
    tps, target = found
    before = _tps(previous)
    parts = [f"target {target:g}" if target is not None else "no target at this scale"]
    if before is not None and before[0]:
        parts.append(f"{tps / before[0] - 1:+.1%} vs the previous night")
    return Tile("throughput", "Throughput", "FAIL" if target is not None and tps < target else
                "ok" if target is not None else "skipped", f"{tps:.1f} TPS/card", "; ".join(parts),
                "sec-throughput", tps)


def routing(report: RunReport) -> Tile:
    """The lowest per-layer share of tokens whose top-k experts agree between rollout and trainer."""
    shares = [float(la["share"]) for d in _docs(report, "routing.agreement") for la in d.get("layers") or ()
              if isinstance(la, dict) and finite(la.get("share"))]
    if not shares:
        return Tile("routing", "MoE routing agreement", "skipped", "not measured", "no routing recorded",
                    "sec-train-inference-consistency-moe")
    tests = [t for t in report.tests if "routing.agreement" in t.properties]
    return Tile("routing", "MoE routing agreement", "FAIL" if any(t.failing for t in tests) else "ok",
                f"\u2265 {100 * min(shares):.1f} %", f"lowest of {len(shares)} layers",
                "sec-train-inference-consistency-moe", min(shares))


def tiles(report: RunReport, previous: RunReport | None = None) -> list[Tile]:
    return [weight_sync(report), curves(report), memory(report), throughput(report, previous), routing(report)]


def sparkline(values: list[float | None]) -> str | None:
    """An inline SVG polyline of the last nights' values (None: a night without it, a gap); None under two
    points. Presentation attributes only: the page's CSP allows no inline style."""
    values = values[-SPARK_NIGHTS:]
    shown = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(shown) < 2:
        return None
    lo, hi = min(v for _, v in shown), max(v for _, v in shown)
    if hi == lo:  # a flat series is drawn across the middle
        lo, hi = lo - 1.0, hi + 1.0
    span = hi - lo
    step = (SPARK_W - 4) / max(len(values) - 1, 1)
    points = " ".join(f"{2 + i * step:.1f},{SPARK_H - 2 - (v - lo) / span * (SPARK_H - 4):.1f}" for i, v in shown)
    last = shown[-1]
    return (f'<svg class="spark" width="{SPARK_W}" height="{SPARK_H}" viewBox="0 0 {SPARK_W} {SPARK_H}" '
            f'role="img" aria-label="last {len(values)} nights"><polyline fill="none" stroke="#57606a" '
            f'stroke-width="1.5" points="{points}"/><circle r="2.5" fill="#0969da" cx="{2 + last[0] * step:.1f}" '
            f'cy="{SPARK_H - 2 - (last[1] - lo) / span * (SPARK_H - 4):.1f}"/></svg>')


def with_sparklines(report: RunReport, history=(), previous: RunReport | None = None) -> list[tuple[Tile, str | None]]:
    """This night's tiles, each with the sparkline of its value over `history` (earlier reports, oldest first)
    and this night."""
    nights = [*history, report][-SPARK_NIGHTS:]
    series = [tiles(r, nights[i - 1] if i else None) for i, r in enumerate(nights)]
    now = tiles(report, previous)
    return [(tile, sparkline([s[k].value for s in series])) for k, tile in enumerate(now)]
