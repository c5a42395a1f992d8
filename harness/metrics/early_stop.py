"""Stop paying for a run that has already failed: the first verdict a running job can no longer pass.

A 671B nightly step takes minutes on 256 cards, and some failures are certain within a few steps: a non-finite loss
or gradient (the update diverged), rollout and actor disagreeing by orders of magnitude beyond float noise (stale
weights in the rollout: seed 001's stale absorbed MLA weights), throughput far below the scale's target after
warm-up. `first_stop(run, rules)` reads the metrics logged so far and returns the first rule that fired, at which
step and on which statistic; the launcher (harness.launch.ray_job) then stops the job and records why. A lost node
is the launcher's own verdict (NodeWatch), not a metric.

Thresholds are data (STOP_RULES / `stop_rules`) and conservative: each is far outside what the full verdict of
harness.metrics.curves would pass (tests/test_early_stop.py holds them to the committed clean goldens: no clean run
stops), so an early stop never ends a run the full verdict would have passed.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from harness.metrics.keys import GRAD_NORM, PG_LOSS, ROLLOUT_PROBS_DIFF, THROUGHPUT
from harness.metrics.run import Run

ROLLOUT_CORR_KL = "rollout_corr/kl"  # verl 0.9.1 trainer/ppo/rollout_corr_helper.py, logged every step
KINDS = ("non-finite", "above", "abs-above", "below")


@dataclass(frozen=True)
class StopRule:
    """`metric` breaks the rule at `consecutive` logged steps in a row (from step `after_step` + 1 on): a non-finite
    value, above / |value| above / below `threshold`."""

    name: str
    metric: str
    kind: str
    threshold: float = math.nan
    consecutive: int = 1
    after_step: int = 0  # warm-up: steps up to here never count
    why: str = ""  # why the threshold is where it is, with the evidence

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"stop rule {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.consecutive < 1:
            raise ValueError(f"stop rule {self.name}: consecutive must be >= 1")

    def broken(self, value: float) -> bool:
        if not math.isfinite(value):
            return True  # every kind: a non-finite value is beyond any band
        if self.kind == "above":
            return value > self.threshold
        if self.kind == "abs-above":
            return abs(value) > self.threshold
        if self.kind == "below":
            return value < self.threshold
        return False


@dataclass(frozen=True)
class StopDecision:
    """Why a run was stopped: the rule, the step it fired at, the values of its window."""

    rule: StopRule
    step: int
    values: tuple[float, ...]

    def message(self) -> str:
        r = self.rule
        shown = ", ".join(f"{v:.3g}" for v in self.values)
        if r.kind == "non-finite":
            what = f"{r.metric} is not finite ({shown})"
        else:
            op = {"above": ">", "abs-above": "|x| >", "below": "<"}[r.kind]
            what = f"{r.metric} {op} {r.threshold:g} for {r.consecutive} step(s) in a row ({shown})"
        return f"stopped at step {self.step} by {r.name}: {what}"

    def to_json(self) -> dict:
        """JSON-safe (launch.json is strict JSON): a non-finite value is written as its name ("nan", "inf")."""
        r = self.rule
        safe = lambda v: v if math.isfinite(v) else str(v)  # noqa: E731
        return {"rule": r.name, "metric": r.metric, "kind": r.kind,
                "threshold": None if math.isnan(r.threshold) else r.threshold, "consecutive": r.consecutive,
                "step": self.step, "values": [safe(v) for v in self.values], "why": r.why}


# rollout vs actor probabilities of the sampled tokens, per precision. fp32: healthy <= 6.5e-9 (probs_diff_max of
# the tiny verl run, DESIGN) and 3.6e-7 to 1.1e-6 in the ten golden runs; the curves band's floor is 1e-4
# (harness.metrics.baseline PRECISION_TOLERANCES); the real trainer's stale-absorbed fault logs ~5e-4 from step 1.
# bf16: healthy ~4.4e-3 on a real Ascend run, band floor 2e-3 + 5 %; 0.05 (the sanity limit, NeMo-RL's
# token_mult_prob_error < 1.1 scale) is an order of magnitude beyond healthy.
PROBS_DIFF_STOP = {"fp32": 2e-4, "bf16": 0.05, "fp16": 0.05}
# |rollout_corr/kl| per precision: fp32 healthy <= 4.2e-8 (DESIGN, tiny fp32 run); the stale-absorbed fault logs
# 1.6e-3 .. 2e-2. No bf16 measurement here: no rule for bf16 (a threshold without evidence could stop a healthy run).
ROLLOUT_KL_STOP = {"fp32": 1e-4}
MISMATCH_STEPS = 2  # consecutive steps: one spike (NeMo-RL ignores the top 5 %) never stops a run
THROUGHPUT_FLOOR = 0.5  # of the target: seed 002 starts at 112 of 120 TPS/card and rises; half is a broken run
THROUGHPUT_WARMUP = 5  # steps (graph capture and the first weight syncs are slower)
THROUGHPUT_STEPS = 3


def truncated_sampling(values: Mapping[str, str]) -> bool:
    """Whether the rollout samples from a truncated distribution (top-k or top-p): verl 0.9.1's rollout returns
    vLLM's processed log-probs (workers/config/rollout.py logprobs_mode="processed_logprobs": after temperature,
    top-k and top-p) while the actor's are the full softmax at the same temperature, so rollout_probs_diff and
    rollout_corr measure the truncation, not a fault (seed 002's top_k 50 / top_p 0.9 on the tiny rehearsal: a
    healthy probs_diff_mean of 0.017)."""
    def number(key: str, default: float) -> float:
        try:
            return float(str(values.get(key, default)).strip("'\""))
        except ValueError:
            return default

    top_k = number("actor_rollout_ref.rollout.top_k", -1)
    return top_k not in (-1, 0) or number("actor_rollout_ref.rollout.top_p", 1.0) < 1.0


def stop_rules(precision: str | None, *, tps_target: float | None = None, devices_per_card: int = 1,
               truncated: bool = False) -> tuple[StopRule, ...]:
    """The rules for a run of `precision` (None: bf16, the wider thresholds) and, with a tokens/s-per-card target,
    the throughput rule (verl's perf/throughput is per device: per card it is x devices_per_card). `truncated`
    (truncated_sampling): no rollout/actor mismatch rule, that mismatch is the recipe's by design."""
    precision = precision if precision in PROBS_DIFF_STOP else "bf16"
    rules = [StopRule("non-finite-loss", PG_LOSS, "non-finite", why="a NaN/inf policy loss never recovers"),
             StopRule("non-finite-grad", GRAD_NORM, "non-finite", why="a NaN/inf gradient norm: the update diverged")]
    if truncated:
        return (*rules, *_throughput(tps_target, devices_per_card))
    rules.append(StopRule("rollout-mismatch", ROLLOUT_PROBS_DIFF, "above", PROBS_DIFF_STOP[precision], MISMATCH_STEPS,
                          why=f"{precision}: rollout and actor disagree far beyond float noise (stale rollout "
                              "weights)"))
    if precision in ROLLOUT_KL_STOP:
        rules.append(StopRule("rollout-kl", ROLLOUT_CORR_KL, "abs-above", ROLLOUT_KL_STOP[precision], MISMATCH_STEPS,
                              why=f"{precision}: KL(rollout || actor) far beyond float noise"))
    return (*rules, *_throughput(tps_target, devices_per_card))


def _throughput(tps_target: float | None, devices_per_card: int) -> tuple[StopRule, ...]:
    if not tps_target:
        return ()
    return (StopRule("throughput", THROUGHPUT, "below", THROUGHPUT_FLOOR * tps_target / devices_per_card,
                     THROUGHPUT_STEPS, THROUGHPUT_WARMUP,
                     why=f"below {THROUGHPUT_FLOOR:.0%} of the {tps_target:g} TPS/card target after warm-up"),)


def first_stop(run: Run, rules: tuple[StopRule, ...]) -> StopDecision | None:
    """The earliest step at which a rule fired (ties: the rule listed first), or None."""
    best: StopDecision | None = None
    for rule in rules:
        if rule.metric not in run:
            continue
        series = run[rule.metric]
        streak: list[float] = []
        for step, value in zip(series.steps, series.values, strict=True):
            if step <= rule.after_step:
                continue
            streak = [*streak, value] if rule.broken(value) else []
            if len(streak) >= rule.consecutive:
                if best is None or step < best.step:
                    best = StopDecision(rule, step, tuple(streak[-rule.consecutive:]))
                break
    return best
