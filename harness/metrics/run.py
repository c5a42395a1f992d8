"""The typed record every checker reads: a `Run` is named metric series by step plus metadata.

Ingesters (verl FileLogger jsonl, console logs, TensorBoard, wandb CSV) produce Runs; suites and
checkers never parse logs themselves (DESIGN: plan -> launch/run -> ingest -> check -> report).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

# meta.json of a run directory (harness.metrics.keys.META_FILE), written by the lab and the launcher.
RUN_META_SCHEMA = "ascend-rl-harness/run-meta"
RUN_META_VERSION = 1

@dataclass(frozen=True)
class Series:
    """One metric: strictly increasing steps and their finite values."""

    steps: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self):
        if len(self.steps) != len(self.values):
            raise ValueError(f"series has {len(self.steps)} steps but {len(self.values)} values")
        if not all(map(operator.lt, self.steps, self.steps[1:])):  # C-level loop: ingest builds 1e5+ points
            raise ValueError("series steps must be strictly increasing")

    def __len__(self) -> int:
        return len(self.steps)

    def window(self, start: int, end: int) -> Series:
        """Steps in [start, end] inclusive."""
        pairs = [(s, v) for s, v in zip(self.steps, self.values, strict=True) if start <= s <= end]
        return Series(tuple(s for s, _ in pairs), tuple(v for _, v in pairs))

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.steps, self.values, strict=True))

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.values)


@dataclass(frozen=True)
class RunMeta:
    """Where a run came from: scale and hardware names, package versions, source files.

    `warnings` holds every irregularity ingest accepted (resumed segments, non-finite values, a dropped
    truncated line under lenient ingest) as "file:line: what" strings: nothing is dropped silently, and
    callers (compare, the report) show them. `skipped_lines` / `skipped_pairs` count what lenient ingest
    dropped; `hardware_in_logs` maps a hardware profile named by a log line (an Ascend device name) to that
    "file:line".
    """

    scale: str | None = None
    hardware: str | None = None
    devices: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    skipped_lines: int = 0
    skipped_pairs: int = 0
    hardware_in_logs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    name: str
    series: dict[str, Series]
    meta: RunMeta = field(default_factory=RunMeta)

    def __getitem__(self, metric: str) -> Series:
        try:
            return self.series[metric]
        except KeyError:
            raise KeyError(f"run {self.name!r} has no metric {metric!r}; it has {len(self.series)} metrics, "
                           f"e.g. {', '.join(sorted(self.series)[:5])}") from None

    def __contains__(self, metric: str) -> bool:
        return metric in self.series

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(sorted({s for series in self.series.values() for s in series.steps}))


@dataclass(frozen=True)
class Summary:
    """A run summarised to one value per metric by a stated statistic: verl's Ascend nightly baseline files hold
    each metric's mean over steps 5-14 (`window`) of the baseline job, as `key: value` lines."""

    name: str
    values: dict[str, float]
    statistic: str
    window: tuple[int, int]
    source: str

    def __contains__(self, metric: str) -> bool:
        return metric in self.values
