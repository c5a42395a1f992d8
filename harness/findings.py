"""What a failed check names, as data: the check, the metric (a verl metric key, a weight, a memory component),
where (a step or window, a layer, a phase) and the one-line message. Checker results expose
`ok`, `message()` and `findings()`; suites assert them through the plugin's `expect` fixture, which records the
findings on the test (property "findings"), so the report and the nightly verdict lines read metric and step
from structure, never by parsing the message."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol


@dataclass(frozen=True)
class Finding:
    check: str  # e.g. "curves.band", "mla.freshness", "throughput.target"
    metric: str  # e.g. "critic/rewards/mean", "W_UV", "logits"; "-" when the check has none
    where: str  # e.g. "step 12", "steps 5-14", "layer 1", "update stage 15"; "-" when nowhere in particular
    message: str

    def to_json(self) -> dict:
        return asdict(self)


class CheckResult(Protocol):
    """What a checker returns: a verdict, its message, and the findings behind a failure."""

    @property
    def ok(self) -> bool: ...

    def message(self) -> str: ...

    def findings(self) -> tuple[Finding, ...]: ...
