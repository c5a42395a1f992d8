"""Tokens per second per device and per card from a verl run, computed exactly as verl does.

verl 0.9.1 (`verl/trainer/ppo/metric_utils.py::compute_throughout_metrics`) logs
`perf/throughput = perf/total_num_tokens / (timing_s/step * n_gpus)`, where `total_num_tokens` is the
sum of `attention_mask` over the batch (prompt + response tokens) and `n_gpus` counts torch devices.
On Atlas A3 a device is a die and a card holds two (seed 002: 128 cards = 256 dies), so verl's figure
is half the per-card figure the target is stated in: 8192 x (77.8 + 1576.6) / 859.68 s / 128 cards =
123.2 TPS/card, while `perf/throughput` reads 61.6. Confusing the two fails or passes the headline
target by 2x, hence every figure here carries both and names its devices.

The figure of a run is a stated statistic over a steady window: by default the median of the steps after
`warmup` (warm-up steps -- graph capture, allocator growth; seed 002 starts at 112 and settles at 120 after
~13 steps -- are skipped); "nightly" is verl's Ascend nightly statistic, the mean of the 5th-14th logged steps
(steps 5-14 of a fresh run, 105-114 of a run resumed at step 101). A comparison with a baseline uses the
baseline's statistic: on a real log with a checkpoint every 10th step the two differ by 7 %, more than the
5 % regression budget.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from harness import numeric
from harness.config.hardware import PROFILES, HardwareProfile
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
from harness.metrics.run import Run, Summary
from harness.metrics.stats import RatioInterval, paired_ratio

# How far our per-device figure may sit from verl's own perf/throughput before we say the device count
# is wrong: both are the same division, so only rounding of logged floats separates them.
DEVICE_COUNT_RTOL = 0.01


def verl_throughput(total_num_tokens: float, step_time_s: float, n_devices: int) -> float:
    """verl's `perf/throughput`: tokens / (step time * devices) -- per *device* (a die on A3)."""
    return total_num_tokens / (step_time_s * n_devices)


STATISTICS = ("median", "nightly")
NIGHTLY_WINDOW = (5, 14)  # verl's Ascend nightly: the 5th..14th logged steps


@dataclass(frozen=True, slots=True)
class StepThroughput:
    step: int
    tokens: float
    step_time_s: float
    tps_per_device: float
    tps_per_card: float


@dataclass(frozen=True)
class Phase:
    """One `timing_s/<name>` phase over the window steps where it occurs (`steps` of them: a checkpoint phase
    runs every Nth step only): its median seconds there, and its share of those steps' time (sum of the phase /
    sum of the step times over the same steps, so a phase can never exceed 100 % of a step)."""

    name: str
    seconds: float
    share: float
    steps: int


@dataclass(frozen=True)
class Throughput:
    """Throughput of one run over its steady window. `tps_per_card` = `tps_per_device` x dies per card;
    `statistic` says how the window's steps were summarised ("median of steps 2-30", "mean of steps 5-14 (verl
    Ascend nightly)"); `warnings` name what may make the figure wrong (hardware the run's meta or logs contradict,
    steps skipped)."""

    run: str
    hardware: str
    devices: int
    dies_per_card: int
    window: tuple[int, ...]  # steps the statistic is taken over
    warmup: tuple[int, ...]  # steps skipped
    tokens_per_step: float
    step_time_s: float
    tps_per_device: float
    tps_per_card: float
    per_step: tuple[StepThroughput, ...]
    phases: tuple[Phase, ...]
    statistic: str = "median"  # one of STATISTICS
    warnings: tuple[str, ...] = ()

    @property
    def cards(self) -> int:
        return self.devices // self.dies_per_card

    @property
    def statistic_text(self) -> str:
        first, last, n = self.window[0], self.window[-1], len(self.window)
        if self.statistic == "nightly":
            return f"mean of steps {first}-{last} (verl Ascend nightly)"
        return f"median of steps {first}-{last} ({n} steps, {len(self.warmup)} warm-up skipped)"

    def to_dict(self, *, per_step: bool = True) -> dict:
        """JSON-ready, for `--json`, `record_property("throughput", ...)` and the report; without the per-step
        rows when `per_step` is False (a 2M-step log's rows are not a summary)."""
        doc = asdict(self)
        if not per_step:
            doc.pop("per_step")
        doc["cards"] = self.cards
        doc["statistic_text"] = self.statistic_text
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
             profile: HardwareProfile, devices_from: str = "--devices") -> int:
    """The device count: given, else verl's own (from perf/throughput); a given count must agree with verl."""
    if THROUGHPUT not in run:
        if devices is None:
            raise BadInput(f"run {run.name!r} logs no {THROUGHPUT}; pass --devices (torch devices: dies on A3)")
        return devices
    logged = run[THROUGHPUT].as_dict()
    implied = [tokens[s] / (times[s] * logged[s]) for s in logged
               if s in tokens and s in times and logged[s] > 0 and math.isfinite(logged[s])]
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
        raise BadInput(f"{devices_from} {devices} disagrees with the run's {THROUGHPUT}, which verl computed with "
                       f"{verl_devices} devices; pass the torch device count ({unit} on {profile.name}: "
                       f"{profile.dies_per_card} per card)")
    return devices


def _no_overlap(run: Run):
    raise BadInput(f"run {run.name!r}: {TOTAL_TOKENS}, {STEP_TIME} and {THROUGHPUT} share no step")


def hardware_warnings(run: Run, profile: HardwareProfile) -> tuple[str, ...]:
    """Where the run's meta.json or its logs name hardware whose dies per card differ from `profile`'s: TPS/card
    is then off by that factor (--hardware a3 on an A2 run silently doubled it)."""
    said = []
    if run.meta.hardware in PROFILES:
        said.append((run.meta.hardware, "its meta.json"))
    said += [(name, f"its log ({where})") for name, where in run.meta.hardware_in_logs.items()]
    out = []
    for name, source in said:
        other = PROFILES[name]
        if name != profile.name and other.dies_per_card != profile.dies_per_card:
            out.append(f"run {run.name}: {source} says {name} ({other.dies_per_card} die(s) per card) but TPS/card is "
                       f"counted for {profile.name} ({profile.dies_per_card} per card): the per-card figure is off by "
                       f"{profile.dies_per_card / other.dies_per_card:g}x; check --hardware")
    return tuple(dict.fromkeys(out))


def _positive(value, option: str, *, integer: bool = False):
    if value is None:
        return None
    if integer:
        return numeric.integer(value, option, low=1)
    return numeric.real(value, option, low=0.0, low_open=True)


def _steady(run: Run, steps: list[int], warmup: int, statistic: str) -> list[int]:
    """The window's steps for the statistic (see the module docstring); a run that cannot fill it says so."""
    if statistic == "median":
        if len(steps) <= warmup:
            raise BadInput(f"run {run.name!r} has {len(steps)} steps with tokens and step time; "
                           f"nothing is left after --warmup {warmup}")
        return steps[warmup:]
    first, last = steps[0] + NIGHTLY_WINDOW[0] - 1, steps[0] + NIGHTLY_WINDOW[1] - 1
    window = [s for s in steps if first <= s <= last]
    if len(window) < last - first + 1:
        raise BadInput(f"run {run.name!r} logged steps {steps[0]}-{steps[-1]} ({len(steps)} with tokens and step "
                       f"time): it cannot fill verl's nightly window {first}-{last} (the {NIGHTLY_WINDOW[0]}th-"
                       f"{NIGHTLY_WINDOW[1]}th logged steps); it has {len(window)} of its {last - first + 1} steps")
    return window


def throughput(run: Run, profile: HardwareProfile, *, devices: int | None = None, sequences: int | None = None,
               warmup: int = 1, statistic: str = "median", devices_from: str = "--devices") -> Throughput:
    """TPS per device and per card of `run` on `profile` hardware, by `statistic` over the steady window:
    "median" of the steps after `warmup`, or "nightly" (verl's mean of the 5th-14th logged steps).

    devices: torch devices of the run (dies on A3); None takes verl's own count from `perf/throughput`.
    sequences: GBS x n, needed only when the run lacks `perf/total_num_tokens`.
    devices_from: where `devices` came from, for the messages (`throughput --hardware a3` blamed a `--devices 1`
    nobody passed: the count was the run's meta.json's).
    """
    if STEP_TIME not in run:
        raise BadInput(f"run {run.name!r} has no {STEP_TIME}; is it a verl run log?")
    numeric.integer(warmup, "--warmup", high=numeric.MAX_STEP)
    if statistic not in STATISTICS:
        raise BadInput(f"--statistic {statistic!r}: use one of {', '.join(STATISTICS)}")
    _positive(devices, "--devices", integer=True)
    _positive(sequences, "--sequences", integer=True)
    times = run[STEP_TIME].as_dict()
    tokens = _tokens_per_step(run, sequences)
    source = run.meta.sources[0] if run.meta.sources else run.name
    # a zero step time divides by zero, a negative one is no time, and a subnormal one (5e-324 s) made TPS inf,
    # which passed any --target: harness.numeric's duration range; tokens within its metric range
    for what, values, low, high, kind in ((STEP_TIME, times, numeric.MIN_SECONDS, numeric.MAX_SECONDS, "duration"),
                                          ("tokens per step", tokens, 0.0, numeric.METRIC_LIMIT, "count")):
        bad = [(s, v) for s, v in values.items() if not (low < v <= high if kind == "count" else low <= v <= high)]
        if bad:
            raise BadInput(f"{source}: step {bad[0][0]} has {what} = {bad[0][1]!r} ({len(bad)} steps outside "
                           f"{'(' if kind == 'count' else '['}{low:g}, {high:g}], the range a {kind} can take); fix or "
                           "drop those steps in the log")
    steps = sorted(s for s in times if s in tokens)
    if not steps:
        raise BadInput(f"run {run.name!r}: {STEP_TIME} and the token counts share no step")
    n = _devices(run, tokens, times, devices, profile, devices_from)
    if n <= 0 or n % profile.dies_per_card:
        origin = f"{devices_from} {n}" if devices is not None else f"verl's {THROUGHPUT}, which counts {n} devices,"
        hint = f"; is it a {run.meta.hardware} run? (--hardware {run.meta.hardware})" if run.meta.hardware in PROFILES \
            and run.meta.hardware != profile.name else ""
        raise BadInput(f"{origin}: on {profile.name} the device count must be a positive multiple of "
                       f"{profile.dies_per_card} (dies per card){hint}")
    per_step = tuple(
        StepThroughput(step=s, tokens=tokens[s], step_time_s=times[s],
                       tps_per_device=verl_throughput(tokens[s], times[s], n),
                       tps_per_card=verl_throughput(tokens[s], times[s], n) * profile.dies_per_card)
        for s in steps)
    window_steps = _steady(run, steps, warmup, statistic)
    in_window = set(window_steps)
    window = [p for p in per_step if p.step in in_window]
    summarise = statistics.median if statistic == "median" else statistics.fmean
    step_time = summarise(p.step_time_s for p in window)
    return Throughput(
        run=run.name, hardware=profile.name, devices=n, dies_per_card=profile.dies_per_card,
        window=tuple(window_steps), warmup=tuple(s for s in steps if s < window_steps[0]),
        tokens_per_step=summarise(p.tokens for p in window), step_time_s=step_time,
        tps_per_device=summarise(p.tps_per_device for p in window),
        tps_per_card=summarise(p.tps_per_card for p in window),
        per_step=per_step, phases=_phases(run, window_steps, times), statistic=statistic,
        warnings=hardware_warnings(run, profile))


def _phases(run: Run, window: list[int], times: dict[int, float]) -> tuple[Phase, ...]:
    names = [k[len(TIMING_PREFIX):] for k in run.series if k.startswith(TIMING_PREFIX) and k != STEP_TIME]
    names.sort(key=lambda n: (PHASE_ORDER.index(n) if n in PHASE_ORDER else len(PHASE_ORDER), n))
    out = []
    for name in names:
        values = run[TIMING_PREFIX + name].as_dict()
        occurs = [s for s in window if s in values and math.isfinite(values[s])]
        if occurs:
            total = sum(times[s] for s in occurs)
            out.append(Phase(name=name, seconds=statistics.median(values[s] for s in occurs),
                             share=sum(values[s] for s in occurs) / total if total > 0 else 0.0, steps=len(occurs)))
    return tuple(out)


def baseline_tps_per_card(baseline: Run | Summary, profile: HardwareProfile, *, devices: int | None = None,
                          sequences: int | None = None, warmup: int = 1) -> tuple[float, str]:
    """(TPS/card, statistic) of a throughput baseline: a verl nightly summary's perf/throughput (per device, the
    mean of steps 5-14: "nightly") x dies per card, or a baseline run's figure by the default statistic."""
    if isinstance(baseline, Summary):
        if THROUGHPUT not in baseline:
            raise BadInput(f"{baseline.source}: the nightly summary has no {THROUGHPUT}; it has "
                           f"{', '.join(sorted(baseline.values)[:8])}")
        value = baseline.values[THROUGHPUT]
        _positive(value, f"{baseline.source}: {THROUGHPUT}")
        return value * profile.dies_per_card, "nightly"
    tp = throughput(baseline, profile, devices=devices if devices is not None else baseline.meta.devices,
                    sequences=sequences, warmup=warmup)
    return tp.tps_per_card, "median"



@dataclass(frozen=True)
class ThroughputVerdict:
    """Pass/fail of one throughput check, with the numbers that decided it."""

    ok: bool
    check: str  # target | regression | graph-mode
    measured: float
    limit: float
    where: str  # the steps (or rounds) the measurement covers
    detail: str
    interval: RatioInterval | None = None  # the confidence interval of `measured`, where it is a paired statistic
    metric: str | None = None  # the metric judged where it is not TPS/card (a phase: timing_s/<name>)

    def message(self) -> str:
        return self.detail

    def findings(self) -> tuple[Finding, ...]:
        metric = self.metric or ("decode tok/s" if self.check == "graph-mode" else "tps_per_card")
        return () if self.ok else (Finding(f"throughput.{self.check}", metric, self.where, self.detail),)


def check_target(tp: Throughput, target_tps_per_card: float) -> ThroughputVerdict:
    """TPS/card over the steady window must reach the scale's target (seed 002: 120 on A3)."""
    _positive(target_tps_per_card, "--target")
    in_window = set(tp.window)
    worst = min((p for p in tp.per_step if p.step in in_window), key=lambda p: p.tps_per_card)
    passed = tp.tps_per_card >= target_tps_per_card
    return ThroughputVerdict(ok=passed, check="target", measured=tp.tps_per_card, limit=target_tps_per_card,
                             where=f"steps {tp.window[0]}-{tp.window[-1]}",
                             detail=f"{tp.run}: {tp.tps_per_card:.1f} TPS/card ({tp.statistic_text}; {tp.devices} "
                                    f"devices = {tp.cards} {tp.hardware} cards) {'>=' if passed else '<'} target "
                                    f"{target_tps_per_card:g}; worst step {worst.step}: {worst.tps_per_card:.1f}")


def check_regression(tp: Throughput, baseline_tps_per_card: float, tolerance: float, *,
                     baseline_statistic: str | None = None) -> ThroughputVerdict:
    """No regression beyond `tolerance` (relative; verl Ascend nightly: throughput >= -5%) vs a baseline figure
    taken by the same statistic (`baseline_statistic`, when given, must be the candidate's)."""
    _positive(baseline_tps_per_card, "baseline TPS/card")
    if type(tolerance) not in (int, float) or not 0 <= tolerance < 1:
        raise BadInput(f"--tolerance {tolerance!r}: must be a fraction in [0, 1)")
    if baseline_statistic is not None and baseline_statistic != tp.statistic:
        raise BadInput(f"the baseline's throughput is a {baseline_statistic} figure but the run's is a {tp.statistic} "
                       f"one; measure the run with --statistic {baseline_statistic}")
    limit = baseline_tps_per_card * (1.0 - tolerance)
    change = tp.tps_per_card / baseline_tps_per_card - 1.0
    passed = tp.tps_per_card >= limit
    return ThroughputVerdict(ok=passed, check="regression", measured=tp.tps_per_card, limit=limit,
                             where=f"steps {tp.window[0]}-{tp.window[-1]}",
                             detail=f"{tp.run}: {tp.tps_per_card:.2f} TPS/card vs baseline "
                                    f"{baseline_tps_per_card:.2f} ({change:+.1%}, allowed -{tolerance:.0%}), both the "
                                    f"{tp.statistic_text}")


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


# Graph mode must not be slower than eager by more than the tolerance, per device kind: CPU test machines are
# shared and noisy, accelerators are measured on a dedicated card.
GRAPH_MODE_TOLERANCE = {"cpu": 0.10, "gpu": 0.03, "npu": 0.03}
# Two-sided confidence of the paired speedup's interval: the FAIL reads its upper bound, a one-sided 95 % bound.
GRAPH_MODE_CONFIDENCE = 0.90


@dataclass(frozen=True)
class DecodeSpeed:
    """Decode rounds of one engine mode: tokens generated per round and each round's wall seconds. Two modes'
    rounds are paired by index (round i of each ran back to back)."""

    mode: str
    tokens_per_round: int
    seconds: tuple[float, ...]

    @property
    def tps(self) -> tuple[float, ...]:
        return tuple(self.tokens_per_round / s for s in self.seconds)

    @property
    def best_tps(self) -> float:  # reported beside the median; no verdict reads one round (see check_graph_not_slower)
        return self.tokens_per_round / min(self.seconds)

    @property
    def median_tps(self) -> float:
        return self.tokens_per_round / statistics.median(self.seconds)

    def to_dict(self) -> dict:
        return {**asdict(self), "best_tps": self.best_tps, "median_tps": self.median_tps}


def check_graph_not_slower(eager: DecodeSpeed, graph: DecodeSpeed, tolerance: float,
                           confidence: float = GRAPH_MODE_CONFIDENCE) -> ThroughputVerdict:
    """Graph-mode decode must not be slower than eager beyond `tolerance` (relative). Decided on the paired
    rounds' speedups (graph tok/s / eager tok/s of round i): FAIL only when even the upper confidence bound of
    their geometric mean is below 1 - tolerance. The best round decided before, and one eager round at 234 tok/s
    (the medians 40.1 vs 39.0) failed graph mode at 0.54x on a shared 2-core machine."""
    if len(eager.seconds) != len(graph.seconds):
        raise BadInput(f"graph vs eager: {len(graph.seconds)} graph rounds but {len(eager.seconds)} eager ones; "
                       "the verdict needs paired rounds")
    speedup = paired_ratio(graph.tps, eager.tps, confidence)
    passed = speedup.high >= 1.0 - tolerance
    return ThroughputVerdict(ok=passed, check="graph-mode", measured=speedup.ratio, limit=1.0 - tolerance,
                             where=f"{speedup.n} paired decode rounds",
                             detail=f"graph/eager decode speedup {speedup.ratio:.2f}x (geometric mean of {speedup.n} "
                                    f"paired rounds, {confidence:.0%} interval {speedup.low:.2f}-{speedup.high:.2f}x; "
                                    f"median graph {graph.median_tps:.1f} vs eager {eager.median_tps:.1f} tok/s): "
                                    + (f"not shown slower than the {1.0 - tolerance:.2f}x allowed" if passed else
                                       f"slower, upper bound {speedup.high:.2f}x < {1.0 - tolerance:.2f}x allowed"),
                             interval=speedup)


# ---------------------------------------------------------------- per-phase verdicts
# Each timing_s/<phase> may be slower than the golden's by at most this (relative) or by the golden's own noise,
# whichever is wider: verl's Ascend nightly allows the step time +5 %; a phase gets the same budget, so a phase that
# slows 25 % while another speeds up (the total within 5 %, verl's check green) fails and is named.
PHASE_RTOL = 0.05


@dataclass(frozen=True)
class PhaseVerdicts:
    """Every `timing_s/<phase>` of a run judged against the same phase of a golden run, one-sided (slower fails,
    faster passes: verl-ascend-recipe PR #130 made performance thresholds one-sided). `not_judged` names the phases
    it could not judge, and why."""

    run: str
    verdicts: tuple[ThroughputVerdict, ...]
    not_judged: tuple[str, ...] = ()

    @property
    def failed(self) -> tuple[ThroughputVerdict, ...]:
        return tuple(v for v in self.verdicts if not v.ok)

    @property
    def ok(self) -> bool:
        return not self.failed

    def message(self) -> str:
        if self.failed:
            head = f"{self.run}: {len(self.failed)} phase(s) slower than the golden: " + ", ".join(
                v.metric[len(TIMING_PREFIX):] for v in self.failed)
        else:
            head = f"{self.run}: every judged phase ({len(self.verdicts)}) within the golden's budget"
        return "\n".join([head, *(v.detail for v in self.failed), *self.not_judged])

    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for v in self.failed for f in v.findings())

    def to_dict(self) -> dict:
        return {"passed": self.ok, "failed": [v.metric[len(TIMING_PREFIX):] for v in self.failed],
                "verdicts": [{"phase": v.metric[len(TIMING_PREFIX):], "passed": v.ok, "measured_s": v.measured,
                              "limit_s": v.limit, "where": v.where, "message": v.detail} for v in self.verdicts],
                "not_judged": list(self.not_judged)}


def check_phases(tp: Throughput, run: Run, golden: Run, tolerance: float = PHASE_RTOL) -> PhaseVerdicts:
    """Each phase of `run` over `tp`'s window (by tp's statistic: the median after warm-up, or the nightly mean)
    against `golden`'s same steps, with the curves' noise model: harness.metrics.curves.window on a MetricBaseline of
    the golden's phase series (its step-to-step noise gives the prediction half-width), read one-sided."""
    from harness.metrics.baseline import CurveTolerance, MetricBaseline, ReferenceCurve, run_seed
    from harness.metrics.curves import window

    if type(tolerance) not in (int, float) or not 0 <= tolerance < 1:
        raise BadInput(f"--tolerance {tolerance!r}: must be a fraction in [0, 1)")
    names = [p.name for p in tp.phases]
    verdicts, skipped = [], []
    for name in names:
        metric = TIMING_PREFIX + name
        if metric not in golden:
            skipped.append(f"{name}: not judged: the golden {golden.name} logs no {metric}")
            continue
        cand, ref_series = run[metric], golden[metric]
        first = cand.steps[0]
        # the throughput window's steps, counted as curves.window counts them: from the series' first logged step
        span = (tp.window[0] - first + 1, tp.window[-1] - first + 1)
        if span[0] < 1:
            skipped.append(f"{name}: not judged: it is first logged at step {first}, after the window starts")
            continue
        tol = CurveTolerance(band_atol=0.0, window=span, window_stat="mean" if tp.statistic == "nightly" else "median",
                             window_atol=0.0, window_rtol=tolerance)
        ref = MetricBaseline(runs=(ReferenceCurve(golden.name, run_seed(golden), ref_series),), tolerance=tol)
        v = window(metric, cand, ref)
        if v.passed is None:
            skipped.append(f"{name}: {v.detail}")
            continue
        if v.value is None or v.reference is None or v.tolerance is None:  # a non-finite window: a finding
            verdicts.append(ThroughputVerdict(ok=False, check="phase", measured=math.nan, limit=math.nan,
                                              where=v.where, detail=f"{metric}: {v.detail}", metric=metric))
            continue
        slower = v.value - v.reference
        ok = slower <= v.tolerance
        change = v.value / v.reference - 1 if v.reference > 0 else math.inf
        verdicts.append(ThroughputVerdict(
            ok=ok, check="phase", measured=v.value, limit=v.reference + v.tolerance, where=v.where, metric=metric,
            detail=f"{metric}: {v.value:.4g} s vs golden {v.reference:.4g} s ({change:+.1%}, {tp.statistic} of "
                   f"{v.where}); allowed +{v.tolerance:.3g} s (max of {tolerance:.0%} and the golden's noise) -> "
                   + ("ok" if ok else f"SLOWER by {slower - v.tolerance:.3g} s beyond it")))
    return PhaseVerdicts(run=run.name, verdicts=tuple(verdicts), not_judged=tuple(skipped))
