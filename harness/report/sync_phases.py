"""The weight-sync phase verdicts of a run: every sync the Megatron sender suite timed (the "sync.phases" property:
suites/functional/test_megatron_sender_sync.py), each phase (export, transfer, load, finalize) against its
platform's budget (harness.config.platforms `sync_phase_budget_s`, measured; a platform without one is reported,
not judged). The nightly prints one `SYNC` line each and fails on a phase over its budget; the report page shows
them as a table."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncVerdict:
    scale: str
    test: str
    engine: str
    exporter: str
    layout: str
    sync: int  # 1-based
    phases: dict[str, float]  # seconds
    budget: dict[str, float]  # seconds; empty: none for this platform

    @property
    def late(self) -> tuple[str, ...]:
        """Budgeted phases over their budget, or not recorded at all (a sync that timed nothing cannot pass)."""
        return tuple(p for p, b in self.budget.items() if p not in self.phases or self.phases[p] > b)

    @property
    def state(self) -> str:
        return f"OVER ({', '.join(self.late)})" if self.late else ("OK" if self.budget else "no budget here")

    def line(self) -> str:
        parts = ", ".join(f"{p} {s:.3g}" + (f"/{self.budget[p]:g}" if p in self.budget else "") + " s"
                          for p, s in self.phases.items())
        text = (f"SYNC {self.scale} {self.exporter} {self.layout} {self.engine} sync {self.sync}: {parts} "
                f"{self.state}")
        return " ".join(text.split())  # one line whatever a name holds


def sync_verdicts(report) -> list[SyncVerdict]:
    """One verdict per recorded sync (a record without a list of syncs is left out)."""
    from harness.config.platforms import PLATFORMS

    out = []
    for nodeid, doc in report.properties("sync.phases"):
        if not isinstance(doc, dict) or not isinstance(doc.get("syncs"), list):
            continue
        platform = doc.get("platform")
        facts = PLATFORMS.get(platform) if isinstance(platform, str) else None
        budget = dict(facts.sync_phase_budget_s) if facts else {}
        for k, phases in enumerate(doc["syncs"], 1):
            if not isinstance(phases, dict):
                continue
            times = {str(p): float(s) for p, s in phases.items()
                     if isinstance(s, (int, float)) and not isinstance(s, bool)}
            out.append(SyncVerdict(scale=report.scale or "-", test=nodeid, engine=str(doc.get("engine")),
                                   exporter=str(doc.get("exporter")), layout=str(doc.get("layout")), sync=k,
                                   phases=times, budget=budget))
    return out
