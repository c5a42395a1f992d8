"""The cost ledger of a nightly run, in card-hours: what it used, what an early abort saved (the steps it did not run,
at the run's own step time, on all its cards), and what the abort would have wasted had it been a false alarm (the
steps already run, which a re-run repeats). One A3 step of seed 002 is 859.68 s x 128 cards = 30.6 card-hours:
an abort at step 5 of 100 saves ~2,900, a false one at step 5 throws away ~150.

Recorded by the throughput suite as the "cost.ledger" property; `python -m harness.report.nightly` prints it."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from harness.errors import BadInput

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class CostLedger:
    run: str
    cards: int
    steps_run: int
    planned_steps: int | None  # None: the plan's step count is unknown (no launch record)
    step_s: float  # median logged step time: what each step not run would have cost
    used_s: float  # sum of the logged step times
    aborted_at: int | None  # the step an early abort stopped the job at (None: not aborted)

    @property
    def card_hours_used(self) -> float:
        return self.used_s * self.cards / SECONDS_PER_HOUR

    @property
    def card_hours_saved(self) -> float | None:
        """Steps left x step time x cards, for an aborted run with a known plan; 0 when not aborted."""
        if self.aborted_at is None:
            return 0.0
        if self.planned_steps is None:
            return None
        return max(0, self.planned_steps - self.steps_run) * self.step_s * self.cards / SECONDS_PER_HOUR

    @property
    def card_hours_false_alarm(self) -> float | None:
        """Had the abort been a false alarm: the steps run are thrown away and run again. None when not aborted."""
        return self.card_hours_used if self.aborted_at is not None else None

    def to_json(self) -> dict:
        return {**asdict(self), "card_hours_used": self.card_hours_used, "card_hours_saved": self.card_hours_saved,
                "card_hours_false_alarm": self.card_hours_false_alarm}

    def line(self) -> str:
        used = f"{self.card_hours_used:,.1f} card-hours used ({self.steps_run} steps x {self.step_s:.0f} s x " \
               f"{self.cards} cards)"
        if self.aborted_at is None:
            return f"{self.run}: {used}; not aborted"
        saved = (f"saved {self.card_hours_saved:,.1f} by the abort at step {self.aborted_at} of "
                 f"{self.planned_steps}" if self.card_hours_saved is not None else
                 f"aborted at step {self.aborted_at} (planned steps unknown: saving not computed)")
        return f"{self.run}: {used}; {saved}; a false alarm would have wasted {self.card_hours_false_alarm:,.1f}"


def cost_ledger(run: str, step_times_s: list[float], cards: int, *, planned_steps: int | None = None,
                aborted_at: int | None = None) -> CostLedger:
    if not step_times_s:
        raise BadInput(f"run {run!r}: no step times logged; nothing to account for")
    if cards < 1:
        raise BadInput(f"run {run!r}: {cards} cards; the ledger needs the run's card count")
    return CostLedger(run=run, cards=cards, steps_run=len(step_times_s), planned_steps=planned_steps,
                      step_s=statistics.median(step_times_s), used_s=sum(step_times_s), aborted_at=aborted_at)


def from_json(doc: dict) -> CostLedger:
    """The ledger a report recorded ("cost.ledger" property); BadInput naming the key when it is not one."""
    try:
        return CostLedger(run=str(doc["run"]), cards=int(doc["cards"]), steps_run=int(doc["steps_run"]),
                          planned_steps=None if doc["planned_steps"] is None else int(doc["planned_steps"]),
                          step_s=float(doc["step_s"]), used_s=float(doc["used_s"]),
                          aborted_at=None if doc["aborted_at"] is None else int(doc["aborted_at"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"cost.ledger property: {type(exc).__name__} {exc}; not a ledger this harness wrote") from None
