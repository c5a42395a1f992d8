"""Tokens per second per device and per card from a verl run, computed exactly as verl does.

verl 0.9.1 (`verl/trainer/ppo/metric_utils.py::compute_throughout_metrics`) logs
`perf/throughput = perf/total_num_tokens / (timing_s/step * n_gpus)`, where `total_num_tokens` is the
sum of `attention_mask` over the batch (prompt + response tokens) and `n_gpus` counts torch devices.
On Atlas A3 a device is a die and a card holds two (seed 002: 128 cards = 256 dies), so verl's figure
is half the per-card figure the target is stated in: 8192 x (77.8 + 1576.6) / 859.68 s / 128 cards =
123.2 TPS/card, while `perf/throughput` reads 61.6. Confusing the two fails or passes the headline
target by 2x, hence every figure here carries both and names its devices.

The figure of a run is the median over a steady window: warm-up steps (graph capture, allocator
growth; seed 002 starts at 112 and settles at 120 after ~13 steps) are skipped.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from harness.config.hardware import HardwareProfile
from harness.errors import BadInput
from harness.findings import Finding
from harness.metrics.keys import (
    PHASE_ORDER,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    STEP_TIME,
    THROUGHPUT,
    TIMING_PREFIX,
    TOTAL_TOKENS,
)
from harness.metrics.run import Run

# How far our per-device figure may sit from verl's own perf/throughput before we say the device count
# is wrong: both are the same division, so only rounding of logged floats separates them.
DEVICE_COUNT_RTOL = 0.01


def verl_throughput(total_num_tokens: float, step_time_s: float, n_devices: int) -> float:
    """verl's `perf/throughput`: tokens / (step time * devices) -- per *device* (a die on A3)."""
    return total_num_tokens / (step_time_s * n_devices)


@dataclass(frozen=True)
class StepThroughput:
    step: int
    tokens: float
    step_time_s: float
    tps_per_device: float
    tps_per_card: float


@dataclass(frozen=True)
class Phase:
    """Median seconds of one `timing_s/<name>` phase over the window, and its share of the step."""

    name: str
    seconds: float
    share: float


@dataclass(frozen=True)
class Throughput:
    """Throughput of one run over its steady window. `tps_per_card` = `tps_per_device` x dies per card."""

    run: str
    hardware: str
    devices: int
    dies_per_card: int
    window: tuple[int, ...]  # steps the medians are taken over
    warmup: tuple[int, ...]  # steps skipped
    tokens_per_step: float
    step_time_s: float
    tps_per_device: float
    tps_per_card: float
    per_step: tuple[StepThroughput, ...]
    phases: tuple[Phase, ...]

    @property
    def cards(self) -> int:
        return self.devices // self.dies_per_card

    def to_dict(self) -> dict:
        """JSON-ready, for `--json`, `record_property("throughput", ...)` and the report."""
        doc = asdict(self)
        doc["cards"] = self.cards
        return doc


def _tokens_per_step(run: Run, sequences: int | None) -> dict[int, float]:
    if TOTAL_TOKENS in run:
        return run[TOTAL_TOKENS].as_dict()
    if PROMPT_LENGTH in run and RESPONSE_LENGTH in run:
        if not sequences:
            raise BadInput(f"run {run.name!r} logs no {TOTAL_TOKENS}; pass --sequences (GBS x n) to count tokens "
                           f"from {PROMPT_LENGTH} + {RESPONSE_LENGTH}")
        prompt, response = run[PROMPT_LENGTH].as_dict(), run[RESPONSE_LENGTH].as_dict()
        return {s: sequences * (prompt[s] + response[s]) for s in prompt if s in response}
    raise BadInput(f"run {run.name!r} has neither {TOTAL_TOKENS} nor {PROMPT_LENGTH}/{RESPONSE_LENGTH}; "
                   "is it a verl run log (FileLogger jsonl or console)?")


def _devices(run: Run, tokens: dict[int, float], times: dict[int, float], devices: int | None,
             profile: HardwareProfile) -> int:
    """The device count: given, else verl's own (from perf/throughput); a given count must agree with verl."""
    if THROUGHPUT not in run:
        if devices is None:
            raise BadInput(f"run {run.name!r} logs no {THROUGHPUT}; pass --devices (torch devices: dies on A3)")
        return devices
    logged = run[THROUGHPUT].as_dict()
    implied = [tokens[s] / (times[s] * logged[s]) for s in logged if s in tokens and s in times and logged[s] > 0]
    if not implied:
        return devices if devices is not None else _no_overlap(run)
    estimate = statistics.median(implied)
    verl_devices = round(estimate)
    unit = "dies" if profile.dies_per_card > 1 else "devices"
    if verl_devices < 1 or abs(estimate - verl_devices) > DEVICE_COUNT_RTOL * max(verl_devices, 1):
        # not an integer device count: the tokens counted here are not the ones the log's perf/throughput used
        raise BadInput(f"run {run.name!r}: its {THROUGHPUT} is not tokens / (step time x devices) for the tokens "
                       f"counted here (it implies {estimate:.3g} devices); check --sequences (GBS x n) or log "
                       f"{TOTAL_TOKENS} as verl's compute_throughout_metrics does")
    if devices is None:
        return verl_devices
    if abs(devices - verl_devices) > DEVICE_COUNT_RTOL * verl_devices:
        raise BadInput(f"--devices {devices} disagrees with the run's {THROUGHPUT}, which verl computed with "
                       f"{verl_devices} devices; pass the torch device count ({unit} on {profile.name}: "
                       f"{profile.dies_per_card} per card)")
    return devices


def _no_overlap(run: Run):
    raise BadInput(f"run {run.name!r}: {TOTAL_TOKENS}, {STEP_TIME} and {THROUGHPUT} share no step")


def throughput(run: Run, profile: HardwareProfile, *, devices: int | None = None, sequences: int | None = None,
               warmup: int = 1) -> Throughput:
    """TPS per device and per card of `run` on `profile` hardware, median over the steps after `warmup`.

    devices: torch devices of the run (dies on A3); None takes verl's own count from `perf/throughput`.
    sequences: GBS x n, needed only when the run lacks `perf/total_num_tokens`.
    """
    if STEP_TIME not in run:
        raise BadInput(f"run {run.name!r} has no {STEP_TIME}; is it a verl run log?")
    if warmup < 0:
        raise BadInput(f"--warmup {warmup}: must be >= 0")
    times = run[STEP_TIME].as_dict()
    tokens = _tokens_per_step(run, sequences)
    steps = sorted(s for s in times if s in tokens)
    if len(steps) <= warmup:
        raise BadInput(f"run {run.name!r} has {len(steps)} steps with tokens and step time; "
                       f"nothing is left after --warmup {warmup}")
    n = _devices(run, tokens, times, devices, profile)
    if n <= 0 or n % profile.dies_per_card:
        raise BadInput(f"--devices {n}: must be a positive multiple of {profile.dies_per_card} "
                       f"(dies per card on {profile.name})")
    per_step = tuple(
        StepThroughput(step=s, tokens=tokens[s], step_time_s=times[s],
                       tps_per_device=verl_throughput(tokens[s], times[s], n),
                       tps_per_card=verl_throughput(tokens[s], times[s], n) * profile.dies_per_card)
        for s in steps)
    window = per_step[warmup:]
    step_time = statistics.median(p.step_time_s for p in window)
    return Throughput(
        run=run.name, hardware=profile.name, devices=n, dies_per_card=profile.dies_per_card,
        window=tuple(p.step for p in window), warmup=tuple(p.step for p in per_step[:warmup]),
        tokens_per_step=statistics.median(p.tokens for p in window), step_time_s=step_time,
        tps_per_device=statistics.median(p.tps_per_device for p in window),
        tps_per_card=statistics.median(p.tps_per_card for p in window),
        per_step=per_step, phases=_phases(run, [p.step for p in window], step_time))


def _phases(run: Run, window: list[int], step_time: float) -> tuple[Phase, ...]:
    names = [k[len(TIMING_PREFIX):] for k in run.series if k.startswith(TIMING_PREFIX) and k != STEP_TIME]
    names.sort(key=lambda n: (PHASE_ORDER.index(n) if n in PHASE_ORDER else len(PHASE_ORDER), n))
    out = []
    for name in names:
        values = run[TIMING_PREFIX + name].as_dict()
        in_window = [values[s] for s in window if s in values]
        if in_window:
            seconds = statistics.median(in_window)
            out.append(Phase(name=name, seconds=seconds, share=seconds / step_time if step_time > 0 else 0.0))
    return tuple(out)


@dataclass(frozen=True)
class ThroughputVerdict:
    """Pass/fail of one throughput check, with the numbers that decided it."""

    ok: bool
    check: str  # target | regression | graph-mode
    measured: float
    limit: float
    where: str  # the steps (or rounds) the measurement covers
    detail: str

    def message(self) -> str:
        return self.detail

    def findings(self) -> tuple[Finding, ...]:
        metric = "decode tok/s" if self.check == "graph-mode" else "tps_per_card"
        return () if self.ok else (Finding(f"throughput.{self.check}", metric, self.where, self.detail),)


def check_target(tp: Throughput, target_tps_per_card: float) -> ThroughputVerdict:
    """TPS/card over the steady window must reach the scale's target (seed 002: 120 on A3)."""
    worst = min(tp.per_step[len(tp.warmup):], key=lambda p: p.tps_per_card)
    passed = tp.tps_per_card >= target_tps_per_card
    return ThroughputVerdict(ok=passed, check="target", measured=tp.tps_per_card, limit=target_tps_per_card,
                             where=f"steps {tp.window[0]}-{tp.window[-1]}",
                             detail=f"{tp.run}: median {tp.tps_per_card:.1f} TPS/card over steps "
                                    f"{tp.window[0]}-{tp.window[-1]} ({len(tp.window)} steps, {tp.devices} devices = "
                                    f"{tp.cards} {tp.hardware} cards) {'>=' if passed else '<'} target "
                                    f"{target_tps_per_card:g}; worst step {worst.step}: {worst.tps_per_card:.1f}")


def check_regression(tp: Throughput, baseline_tps_per_card: float, tolerance: float) -> ThroughputVerdict:
    """No regression beyond `tolerance` (relative; verl Ascend nightly: throughput >= -5%) vs a baseline."""
    limit = baseline_tps_per_card * (1.0 - tolerance)
    change = tp.tps_per_card / baseline_tps_per_card - 1.0
    passed = tp.tps_per_card >= limit
    return ThroughputVerdict(ok=passed, check="regression", measured=tp.tps_per_card, limit=limit,
                             where=f"steps {tp.window[0]}-{tp.window[-1]}",
                             detail=f"{tp.run}: median {tp.tps_per_card:.2f} TPS/card vs baseline "
                                    f"{baseline_tps_per_card:.2f} ({change:+.1%}, allowed -{tolerance:.0%}) over "
                                    f"steps {tp.window[0]}-{tp.window[-1]}")


def graph_mode(run: Run) -> bool | None:
    """Was the run's rollout in graph mode (vLLM `enforce_eager=False`)? None when its config is unrecorded.

    Reads the run's meta.json (`run.meta.extra`): a resolved verl config under "config", or the Hydra
    "overrides" list the launcher passed (`actor_rollout_ref.rollout.enforce_eager=False`).
    """
    extra = run.meta.extra
    config = extra.get("config")
    if isinstance(config, dict):
        rollout = config.get("actor_rollout_ref", {}).get("rollout", {})
        if "enforce_eager" in rollout:
            return not _truthy(rollout["enforce_eager"])
    for override in extra.get("overrides") or ():
        key, _, value = str(override).lstrip("+").partition("=")
        if key == "actor_rollout_ref.rollout.enforce_eager":
            return not _truthy(value)
    return None


def _truthy(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


# Graph mode must not be slower than eager. Tolerance per device kind: CPU test machines are shared and
# noisy (the minimum over rounds damps that), accelerators are measured on a dedicated card.
GRAPH_MODE_TOLERANCE = {"cpu": 0.10, "gpu": 0.03, "npu": 0.03}


@dataclass(frozen=True)
class DecodeSpeed:
    """Decode rounds of one engine mode: tokens generated per round and each round's wall seconds."""

    mode: str
    tokens_per_round: int
    seconds: tuple[float, ...]

    @property
    def best_tps(self) -> float:
        # The fastest round: the estimate least distorted by other processes on a shared machine
        # (timeit's rationale); the median is reported beside it.
        return self.tokens_per_round / min(self.seconds)

    @property
    def median_tps(self) -> float:
        return self.tokens_per_round / statistics.median(self.seconds)

    def to_dict(self) -> dict:
        return {**asdict(self), "best_tps": self.best_tps, "median_tps": self.median_tps}


def check_graph_not_slower(eager: DecodeSpeed, graph: DecodeSpeed, tolerance: float) -> ThroughputVerdict:
    """Graph-mode decode throughput must be at least eager's, within `tolerance` (relative)."""
    speedup = graph.best_tps / eager.best_tps
    passed = speedup >= 1.0 - tolerance
    return ThroughputVerdict(ok=passed, check="graph-mode", measured=speedup, limit=1.0 - tolerance,
                             where=f"{len(graph.seconds)} decode rounds",
                             detail=f"graph mode decodes {graph.best_tps:.1f} tok/s (median {graph.median_tps:.1f}) "
                                    f"vs eager {eager.best_tps:.1f} (median {eager.median_tps:.1f}): speedup "
                                    f"{speedup:.2f}x ({'>=' if passed else '<'} {1.0 - tolerance:.2f}x allowed) over "
                                    f"{len(graph.seconds)} / {len(eager.seconds)} rounds, slowest graph round "
                                    f"{max(graph.seconds):.3f} s")
