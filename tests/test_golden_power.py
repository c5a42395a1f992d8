"""Self-tests of what a golden reads and what it can detect (issue 43), and of compare's terminal output (issue 47).

- constants: a metric every golden run logs alike (a setting, a schedule) that a candidate changes fails, named with
  its first differing step (the seeded bug: the verdict read 5 of verl's ~91 metrics, and a flat run's changed
  setting passed unseen); a clean candidate passes them; schema-2 goldens still load and say they check none.
- power: `baseline record` states each statistic's MDE and flags a golden WEAK whose reward MDE exceeds half its own
  gain (the seeded bug: a weak golden accepted silently); the simulated MDE is what the real verdict detects.
- compare prints failures first, `--failed-only` prints nothing else, and lines fit $COLUMNS.
"""
from __future__ import annotations

import dataclasses
import fractions
import json
import math
import random

import pytest

from harness.cli import main as cli_main
from harness.errors import BadInput
from harness.metrics import curves, power
from harness.metrics.baseline import STUCK_STEPS, Baseline, default_tolerance, find_constants, load_baseline
from harness.metrics.run import Run, RunMeta, Series

REWARD = "critic/rewards/mean"
LR = "actor/lr"
WARMUP = "actor/lr_warmup"  # a schedule: the same in every run, not one value
CLIP = "actor/pg_clipfrac"  # noise: never a constant
MAX = "critic/rewards/max"  # at its bound in every golden step, not in every clean run's: never a constant
PEARSON = "training/rollout_actor_probs_pearson_corr"  # float noise at its bound 1.0: never a constant


def rising(step):
    return -0.9 + 0.08 * min(step, 12)


def lab_like(name, seed, fn=rising, noise=0.03, steps=30, lr=1e-3, lr_from=None, first=1, dip=4) -> Run:
    rng = random.Random(seed)
    s = tuple(range(first, first + steps))
    lrs = tuple(lr if lr_from is None or t < lr_from else lr * 10 for t in s)
    return Run(name, {REWARD: Series(s, tuple(fn(t) + rng.gauss(0, noise) for t in s)),
                      LR: Series(s, lrs),
                      WARMUP: Series(s, tuple(1e-3 * min(t, 5) / 5 for t in s)),
                      CLIP: Series(s, tuple(0.2 + rng.gauss(0, 0.02) for _ in s)),
                      MAX: Series(s, (1.0,) * len(s)),
                      PEARSON: Series(s, tuple(1.0 - 5.96e-8 * rng.randrange(dip) for _ in s))},
               RunMeta(scale="tiny", hardware="cpu", sources=(f"{name}.jsonl",), extra={"seed": seed}))


@pytest.fixture(scope="module")
def golden():
    return Baseline.from_runs([lab_like(f"r{i}", i) for i in range(3)], (REWARD,))


def test_the_golden_keeps_what_every_run_logs_alike(golden):
    assert set(golden.constants) == {LR, WARMUP}  # the noisy metric is not kept; the judged reward is judged
    # one run cannot tell a schedule from noise: only one value at every step is a constant there
    assert set(find_constants([lab_like("r0", 0)], (REWARD,))) == {LR}
    # the correlation jitters by ulps below 1.0, within the constants' tolerance: noise, in one run or three. Kept as
    # a constant (as the tolerance alone kept it), a clean run that dips a little deeper failed on it.
    deeper = curves.compare(lab_like("clean", 60, dip=20), golden)
    assert deeper.passed, deeper.message()
    # the actor logs its lr only at steps that updated (DAPO skips a step whose groups all agree): still one value
    skipped = lab_like("r1", 1)
    lr = skipped[LR]
    skipped.series[LR] = Series(lr.steps[:4] + lr.steps[5:], lr.values[:4] + lr.values[5:])
    assert LR in find_constants([lab_like("r0", 0), skipped], (REWARD,))


def test_a_clip_ratio_at_zero_is_a_measurement_not_a_setting():
    """No response of a clean seed may reach the length cap in 30 steps (5 of 20 warm-started lab seeds), while
    another seed's clip a few: kept as a one-run golden's constant, the clip ratio at 0 failed those clean runs
    (16 of 90 comparisons). A clip ratio is a share of the batch, never a constant; a setting still is."""
    trunc = "response_length_non_aborted/clip_ratio"
    zero, once = lab_like("r0", 0), lab_like("clean", 50)
    steps = zero[REWARD].steps
    zero.series[trunc] = Series(steps, (0.0,) * len(steps))
    once.series[trunc] = Series(steps, tuple(0.125 if t == 9 else 0.0 for t in steps))
    one_run = Baseline.from_runs([zero], (REWARD,))
    assert set(one_run.constants) == {LR}
    alignment = curves.compare(once, one_run)
    assert alignment.passed, alignment.message()


def test_a_changed_setting_fails_and_names_its_first_step(golden):
    clean = curves.compare(lab_like("clean", 50), golden)
    assert clean.passed, clean.message()
    assert any(v.statistic == "constant" and v.passed for v in clean.verdicts)
    changed = curves.compare(lab_like("lr-x10", 51, lr_from=7), golden)  # reward unchanged, lr x10 from step 7
    failed = [v for v in changed.failures if v.statistic == "constant"]
    assert [v.metric for v in failed] == [LR] and failed[0].where == "step 7", changed.message()
    assert "0.01 vs the golden's 0.001 at step 7" in failed[0].detail
    # a resumed run is checked at its own steps against a one-value constant
    resumed = curves.compare(lab_like("resumed", 52, first=101, lr_from=105), golden)
    assert any(v.metric == LR and v.where == "step 105" for v in resumed.failures), resumed.message()


def test_a_candidate_that_does_not_log_a_constant_is_not_judged_on_it(golden):
    run = lab_like("console", 53)
    run = dataclasses.replace(run, series={k: v for k, v in run.series.items() if k != WARMUP})
    alignment = curves.compare(run, golden)
    assert alignment.passed
    unjudged = [v for v in alignment.verdicts if v.statistic == "constant" and v.passed is None]
    assert len(unjudged) == 1 and WARMUP in unjudged[0].detail


def test_constants_round_trip_and_schema_2_still_loads_with_a_note(golden, tmp_path):
    path = golden.save(tmp_path / "g.json")
    loaded = load_baseline(path)
    assert loaded.constants == golden.constants
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 3
    old = {k: v for k, v in doc.items() if k != "constants"}
    (tmp_path / "v2.json").write_text(json.dumps({**old, "schema_version": 2}))
    v2 = load_baseline(tmp_path / "v2.json")
    assert v2.constants is None
    alignment = curves.compare(lab_like("lr-x10", 51, lr_from=7), v2)
    assert alignment.passed and any("schema 2" in n and "re-record" in n for n in alignment.notes)
    # retuned and rewritten, it stays schema 2: "constants": {} would claim no metric was alike
    v2.retuned({REWARD: (3.0, 3.0, 3.0)}).save(tmp_path / "v2.json", force=True)
    assert json.loads((tmp_path / "v2.json").read_text())["schema_version"] == 2
    doc["constants"][LR] = {"steps": [2, 1], "values": [1e-3, 1e-3]}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(BadInput, match=f"constants: {LR}: needs"):
        load_baseline(tmp_path / "bad.json")


def _write(path, run: Run) -> str:
    lines = [json.dumps({"step": s, "data": {m: run[m].as_dict()[s] for m in run.series if s in run[m].as_dict()}})
             for s in run.steps]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_record_states_the_power_and_flags_a_weak_golden(tmp_path, capsys):
    # weak: the reward barely rises (+0.05) under noise 0.3 -- a run that learns nothing would pass it
    weak = [_write(tmp_path / f"w{i}.jsonl", lab_like(f"w{i}", i, fn=lambda t: -0.9 + 0.005 * min(t, 10),
                                                      noise=0.3)) for i in range(3)]
    assert cli_main(["baseline", "record", *weak, "--out", str(tmp_path / "weak.json")]) == 0
    out = capsys.readouterr().out
    assert "WEAK golden" in out and "more reference runs" in out and "window-mean: MDE" in out
    table = json.loads((tmp_path / "weak.json").read_text())["power"]
    assert table["weak"] is True and table["advice"].startswith("WEAK")
    assert cli_main(["compare", weak[0], str(tmp_path / "weak.json")]) == 0  # every compare against it says so
    assert "the golden is WEAK" in capsys.readouterr().out
    entry = table[f"{REWARD} window-mean"]
    assert entry["metric"] == REWARD and entry["mde"] > table["reward_gain"] / 2
    # strong: a clear gain (+0.96) over small noise
    strong = [_write(tmp_path / f"s{i}.jsonl", lab_like(f"s{i}", i)) for i in range(3)]
    assert cli_main(["baseline", "record", *strong, "--out", str(tmp_path / "strong.json"), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["power"]
    assert table["weak"] is False and table["advice"] is None
    assert table[f"{REWARD} window-mean"]["mde"] < table["reward_gain"] / 2


def test_the_simulated_mde_is_what_the_verdict_detects(golden):
    """Candidates drawn like the golden's runs, their reward lowered by the window's MDE, fail the window in about
    POWER of cases; lowered by half of it, in far fewer. The golden's runs have no inflation beyond their noise
    (a recipe nobody calibrated keeps NOISE_INFLATION), so the candidates' noise is widened the same way."""
    ref = golden.metrics[REWARD]
    mde = power.metric_mde(REWARD, ref)["window-mean"][0]
    noise = 0.03 * ref.tolerance.window_inflation

    def caught(shift):
        hits = 0
        for seed in range(300, 500):
            run = lab_like("c", seed, fn=lambda t: rising(t) - shift, noise=noise)
            hits += any(v.statistic == "window-mean" for v in curves.compare(run, golden, (REWARD,)).failures)
        return hits / 200

    assert 0.6 <= caught(mde) <= 0.97
    assert caught(mde / 2) < 0.35


def _failing_and_passing(tmp_path) -> tuple[str, str]:
    refs = [_write(tmp_path / f"r{i}.jsonl", lab_like(f"r{i}", i)) for i in range(3)]
    golden = tmp_path / "golden.json"
    assert cli_main(["baseline", "record", *refs, "--out", str(golden)]) == 0
    return _write(tmp_path / "bad.jsonl", lab_like("bad", 60, lr_from=20)), str(golden)


@pytest.mark.parametrize("columns", ["80", "200"])
def test_compare_prints_failures_first_and_fits_the_terminal(tmp_path, capsys, monkeypatch, columns):
    bad, golden = _failing_and_passing(tmp_path)
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", columns)
    assert cli_main(["compare", bad, golden]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= int(columns)
    verdicts = [line for line in lines if " FAIL" in line or " ok" in line or "not judged" in line]
    assert verdicts and "FAIL" in verdicts[0] and LR in verdicts[0], lines
    first_ok = next(i for i, line in enumerate(verdicts) if " ok" in line)
    assert all("FAIL" not in line for line in verdicts[first_ok:])
    assert cli_main(["compare", bad, golden, "--failed-only"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any("FAIL" in line and LR in line for line in lines)
    assert not any(" ok " in f" {line} " for line in lines[:-1]), lines


def test_judging_more_metrics_spends_one_false_alarm_budget():
    """Ten metrics (30 statistics) share the budget the five's 15 statistics spent at 0.998 each: every statistic
    is judged stricter, so together they false-alarm no more (the seeded bug: each kept 0.998, 2x the alarms)."""
    from harness.metrics.baseline import FAMILY_ALPHA

    names = [f"{REWARD}", *(f"extra/m{i}" for i in range(9))]
    runs = []
    for i in range(3):
        rng = random.Random(i)
        runs.append(Run(f"r{i}", {m: Series(tuple(range(1, 31)), tuple(rng.gauss(0, 1) for _ in range(30)))
                                  for m in names}, RunMeta(extra={"seed": i})))
    golden_tol = _tol()
    golden = Baseline.from_runs(runs, tuple(names), dict.fromkeys(names, golden_tol))
    five, ten = golden.judged(tuple(names[:5])), golden.judged(tuple(names))
    assert five.metrics[REWARD].tolerance.confidence == golden_tol.confidence  # 15 statistics: as calibrated
    alphas = [3 * (1 - b.tolerance.confidence) for b in ten.metrics.values()]
    assert sum(alphas) == pytest.approx(FAMILY_ALPHA)
    wide = [ten.metrics[REWARD].half_width(i) > five.metrics[REWARD].half_width(i) for i in range(30)]
    assert all(wide)
    verdict = next(v for v in curves.compare(runs[0], golden, tuple(names)).verdicts if v.statistic == "band")
    assert verdict.tolerance == pytest.approx(ten.metrics[REWARD].half_width(int(verdict.where.split()[1]) - 1))


def _tol():
    from harness.metrics.baseline import CurveTolerance

    return CurveTolerance(band_atol=0.0, window_atol=0.0, trend_atol=0.0)


def test_a_stored_constant_that_jitters_is_dropped_on_load(golden, tmp_path):
    """A golden recorded before the jitter rule stored the lab's probability correlation as a constant
    (baselines/tiny/dapo_lab.json did): loaded, it is not judged, so it cannot flag a clean run."""
    path = golden.save(tmp_path / "g.json")
    doc = json.loads(path.read_text())
    doc["constants"][PEARSON] = {"steps": [1, 2, 3], "values": [1.0, 0.9999999403953552, 1.0]}
    path.write_text(json.dumps(doc))
    assert set(load_baseline(path).constants) == {LR, WARMUP}


KL = "actor/ppo_kl"  # a continuous measurement: never the same value twice in a clean run


def with_kl(run: Run, seed: int, stuck_from: int | None = None, value: float = 0.0) -> Run:
    """`run` logging a signed KL estimate, one value from `stuck_from` on (a frozen optimizer: ratio 1, KL 0)."""
    rng = random.Random(seed)
    steps = run[REWARD].steps
    kl = tuple(value if stuck_from is not None and t >= stuck_from else rng.gauss(0.01, 0.01) for t in steps)
    return dataclasses.replace(run, series={**run.series, KL: Series(steps, kl)})


def test_a_metric_that_moves_in_every_golden_run_and_sticks_in_the_candidate_fails():
    """A part of the trainer that stops (a frozen optimizer: its KL exactly 0 from the step it froze; a zeroed
    advantage: the policy loss exactly 0) fails on the metric it froze, named with its value and stretch, though its
    curves sit inside every band. A clean candidate passes; a share pinned at 0 (a converged run clips nothing)
    and a metric the golden's runs repeat themselves (the clip fraction here, the reward's max) are never stuck.
    Seeded bug: without the rule the frozen run is ALIGNED."""
    runs = [with_kl(lab_like(f"r{i}", i), i) for i in range(3)]
    golden = Baseline.from_runs(runs, (REWARD,))
    assert set(golden.moving) == {KL, CLIP, REWARD}, golden.moving  # the settings, the max and the jitter are not
    assert curves.compare(with_kl(lab_like("clean", 50), 50), golden).passed
    frozen = curves.compare(with_kl(lab_like("frozen", 51), 51, stuck_from=4), golden)
    failed = [v for v in frozen.failures if v.statistic == "stuck"]
    assert [(v.metric, v.where, v.value) for v in failed] == [(KL, "steps 4-30", 0.0)], frozen.message()
    assert "27 steps in a row" in failed[0].detail and not frozen.passed
    # a few steps alike happen: the longest clean stretch measured was 3 (a lab seed near convergence trained one
    # on-policy mini-batch a step, its KL exactly 0); STUCK_STEPS in a row do not
    blip = with_kl(lab_like("blip", 52), 52)
    kl = list(blip[KL].values)
    kl[10:10 + max(3, STUCK_STEPS - 1)] = [kl[10]] * max(3, STUCK_STEPS - 1)
    assert curves.compare(dataclasses.replace(blip, series={**blip.series, KL: Series(blip[KL].steps, tuple(kl))}),
                          golden).passed
    # a share (every golden value in [0, 1]) pinned at its bound 0 is a converged run, not a stuck one
    converged = lab_like("converged", 53)
    steps = converged[CLIP].steps
    converged = dataclasses.replace(converged, series={
        **with_kl(converged, 53).series, CLIP: Series(steps, tuple(0.0 if t > 10 else v for t, v in zip(
            steps, converged[CLIP].values, strict=True)))})
    assert not [v for v in curves.compare(converged, golden).failures if v.statistic == "stuck"]


def with_series(run: Run, metric: str, values, steps=None) -> Run:
    return dataclasses.replace(run, series={**run.series, metric: Series(steps or run[metric].steps, tuple(values))})


def test_a_golden_whose_runs_rest_at_one_value_still_judges_a_run_stuck_there():
    """Found on the lab (issue 43): a clean seed that has learned the task trains one on-policy mini batch a step and
    logs its KL exactly 0 for a few steps in a row. One such golden run made the rule judge no KL at all, and a frozen
    optimizer (KL 0 from the step it froze, 1e-9 of rounding at some steps) passed every 5-run lab golden on it. The
    golden stores its runs' longest rest; a candidate fails at more than twice that and more than a third of the
    golden's steps (30 here: 11). Seeded bugs: the old rule (no value twice in the golden) and exact equality each
    let the frozen run pass; a count (whole numbers) judged, or a step that logged nothing not ending a rest, each
    fail a clean run."""
    from harness.metrics.baseline import find_moving, stuck_limit

    def resting(run: Run, start: int, length: int) -> Run:
        kl = list(run[KL].values)
        kl[start:start + length] = [0.0] * length
        return with_series(run, KL, kl)

    runs = [resting(with_kl(lab_like("r0", 0), 0), 22, 4), *(with_kl(lab_like(f"r{i}", i), i) for i in (1, 2))]
    golden = Baseline.from_runs(runs, (REWARD,))
    assert golden.moving[KL][2] == 4 and stuck_limit(4, 30) == 11
    frozen = with_kl(lab_like("frozen", 51), 51, stuck_from=4)
    frozen = with_series(frozen, KL, [v + (1e-9 if t % 3 == 0 and t >= 4 else 0.0)
                                      for t, v in zip(frozen[KL].steps, frozen[KL].values, strict=True)])
    verdict = curves.compare(frozen, golden)
    assert [(v.metric, v.where) for v in verdict.failures if v.statistic == "stuck"] == [(KL, "steps 4-30")], \
        verdict.message()
    (said,) = [v for v in verdict.failures if v.statistic == "stuck"]
    assert "27 steps in a row (4-30; 11 fail); every golden run held one value at most 4 steps" in said.detail
    # a clean candidate that rests as long as the limit allows passes; one step longer fails
    assert curves.compare(resting(with_kl(lab_like("c", 52), 52), 15, 10), golden).passed
    assert not curves.compare(resting(with_kl(lab_like("c", 52), 52), 15, 11), golden).passed
    # a step that logged no KL (it trained nothing) ends a rest: 6 + 6 steps at 0 around a gap are two rests
    gapped = resting(with_kl(lab_like("c", 53), 53), 10, 13)
    steps = gapped[KL].steps
    gapped = with_series(gapped, KL, gapped[KL].values[:16] + gapped[KL].values[17:], steps[:16] + steps[17:])
    assert curves.compare(gapped, golden).passed
    # a golden run whose rest jitters by rounding (0, 1e-9, 0, ...) rests at one value: the KL is still judged
    jittered = with_series(runs[0], KL, [v + (1e-9 if i % 2 else 0.0) if v == 0.0 else v
                                         for i, v in enumerate(runs[0][KL].values)])
    assert find_moving([jittered, *runs[1:]], {}, default_tolerance(REWARD))[KL][2] == 4
    # a run that diverges (NaN from step 10 on) is not stuck at a value it never held
    diverged = with_kl(lab_like("nan", 54), 54)
    diverged = with_series(diverged, KL, [v if t < 10 else math.nan for t, v in zip(
        diverged[KL].steps, diverged[KL].values, strict=True)])
    assert not [v for v in curves.compare(diverged, golden).failures if v.statistic == "stuck"]
    # a rest at the golden's own extreme is a bound the metric saturates at (a batch's largest GRPO advantage when one
    # sample of 8 alone succeeds), not a stuck trainer
    top = golden.moving[KL][1]
    saturated = with_kl(lab_like("top", 55), 55)
    saturated = with_series(saturated, KL, [top if 10 <= t < 24 else v for t, v in zip(
        saturated[KL].steps, saturated[KL].values, strict=True)])
    assert curves.compare(saturated, golden).passed
    # a count (every value a whole number: groups kept, 8 at most steps) is not a measurement that moves
    kept = [with_series(r, "train/kept_groups", [8.0 if t % 7 else 10.0 * i + t // 7 for t in r[REWARD].steps],
                        r[REWARD].steps) for i, r in enumerate(runs)]
    assert "train/kept_groups" not in find_moving(kept, {}, default_tolerance(REWARD))


def test_a_run_that_skips_its_update_at_every_other_step_fails_on_the_steps_it_rests():
    """Issue 43: verl's quarter-updates fault (one optimizer update in four) logs `actor/ppo_kl` exactly 0 at every
    step with no update, never two in a row, so no stretch is stuck, and its reward sits inside the golden's bands.
    The golden stores the most steps of its reward window (steps 5-14 here) any run held one value at; a candidate
    at one value at more than twice that and at least 5 of them fails, named with the value and the steps. Seeded
    bugs: judging stretches alone lets the run pass; counting over the whole run fails a clean run that rests once
    it has learned (lab seed 214: its mean advantage 0 at 13 of 30 steps, 2 of them in the window); a window one step
    short, shifted, counted by position in a series that skips a step, or anchored on a KL that starts a step after
    the reward each misplace it. A golden whose runs rest as often in the window lets the run pass, and a golden
    recorded before the count says it judged stretches only."""
    from harness.metrics.baseline import find_moving

    def zeros_at(run: Run, at) -> Run:
        return with_series(run, KL, [0.0 if t in at else v for t, v in zip(run[KL].steps, run[KL].values,
                                                                           strict=True)])

    def rests(verdict) -> list:
        return [(v.where, v.value) for v in verdict.failures if v.statistic == "stuck"]

    runs = [with_kl(lab_like(f"r{i}", i), i) for i in range(3)]
    golden = Baseline.from_runs(runs, (REWARD,))
    assert golden.moving[KL][2:] == (1, 1, 1)
    candidate = with_kl(lab_like("q", 60), 60)
    skipping = zeros_at(candidate, range(5, 31, 2))  # 0 at steps 5, 7, ..., 29: 5 of steps 5-14
    verdict = curves.compare(skipping, golden)
    (said,) = [v for v in verdict.failures if v.statistic == "stuck"]
    assert (said.metric, said.where, said.value) == (KL, "5 of steps 5-14", 0.0) and not verdict.passed
    assert ("0 at 5 of the 10 steps it logged in 5-14, the window (5, 7, 9, 11, 13; 5 fail); every golden run moved "
            "it at every step there") in said.detail, said.detail
    # the window's last step counts, the step before its first does not: 4 of them pass
    assert rests(curves.compare(zeros_at(candidate, (6, 8, 10, 12, 14)), golden)) == [("5 of steps 5-14", 0.0)]
    assert curves.compare(zeros_at(candidate, (4, 6, 8, 10, 12)), golden).passed
    # a run resting at 13 of 30 steps once it has learned, 2 of them in the window, passes
    late = zeros_at(with_kl(lab_like("late", 61), 61), (*range(11, 31, 2), 16, 22, 28))
    assert sum(v == 0.0 for v in late[KL].values) == 13 and curves.compare(late, golden).passed
    # steps, not positions, from the reward's first step: a resumed run (steps 101-130) whose KL skips step 103, and
    # a KL that starts a step after the reward
    resumed = [with_kl(lab_like(f"r{i}", i, first=101), i) for i in range(3)]
    gapped = zeros_at(with_kl(lab_like("q", 60, first=101), 60), (105, 107, 109, 111, 113))
    gapped = with_series(gapped, KL, gapped[KL].values[:2] + gapped[KL].values[3:],
                         gapped[KL].steps[:2] + gapped[KL].steps[3:])
    assert rests(curves.compare(gapped, Baseline.from_runs(resumed, (REWARD,)))) == [("5 of steps 105-114", 0.0)]
    late_kl = with_series(skipping, KL, skipping[KL].values[1:], skipping[KL].steps[1:])
    assert rests(curves.compare(late_kl, golden)) == [("5 of steps 5-14", 0.0)]
    # a golden whose own runs rested at 5 steps of the window allows 10
    resting = [zeros_at(runs[0], (5, 7, 9, 11, 13)), *runs[1:]]
    assert find_moving(resting, {}, default_tolerance(REWARD))[KL][2:] == (1, 5, 1)
    assert curves.compare(skipping, Baseline.from_runs(resting, (REWARD,))).passed
    # twice the most, not the median run's: STUCK_STEPS is no calibrated tail (the clip fraction's share is)
    assert curves.compare(zeros_at(candidate, (5, 6, 7, 9, 11, 12, 13)), Baseline.from_runs(resting, (REWARD,))).passed
    # a golden recorded before the count judges stretches only, and says so
    old = dataclasses.replace(golden, moving={m: (*r[:3], None, None) for m, r in golden.moving.items()})
    verdict = curves.compare(skipping, old)
    assert verdict.passed, verdict.message()
    assert any(v.passed is None and "the golden predates their count" in v.detail and KL in v.detail
               for v in verdict.verdicts)


def test_a_run_whose_update_clips_nothing_at_most_window_steps_fails(monkeypatch):
    """Issue 43's damped-updates (every AdamW step a quarter of its move): no step is skipped, so the KL never rests
    and the reward only lags, but the update rarely moves a token's ratio past the clip, and `actor/pg_clipfrac` is
    exactly 0 at 7-10 of the window's steps where clean seeds clip nothing at a few (two of the lab's 100
    calibration seeds at 7). The update's clip fraction, whose shares of a few hundred tokens repeat, is judged for
    its rests in the calibrated window (steps 5-14), its 0 counted, failing from CLIP_REST_SHARE of the window's steps
    (8 of 10). Not after the window (a converged run clips nothing), not in a window moved later, not for a value
    function's or dual-clip's lower clip fraction, not for a share generation produces (the response length's clip
    ratio). Against a golden of several runs it fails at more than twice the median run's count and more than the
    most's (a golden of more runs holds a slow seed more often). Seeded bugs: the clip fraction left out of the moving
    metrics for its repeats, or its 0 a bound in the window (the rule before), each let the damped run pass; so does
    twice the most golden run's count against a golden holding one slow run; the other rests' limit (STUCK_STEPS of
    10) fails the clean seed at 7; the count in a moved window fails a run converged there."""
    from harness.metrics import baseline as bl

    def zero_at(run: Run, metric: str, at, tokens: int = 256) -> Run:
        rng = random.Random(f"{run.name}{metric}")  # shares of a few hundred tokens: values repeat
        steps = run[REWARD].steps
        return with_series(run, metric, [0.0 if t in at else round((0.2 + rng.gauss(0, 0.02)) * tokens) / tokens
                                         for t in steps], steps)

    runs = [zero_at(lab_like(f"r{i}", i), CLIP, (6, 9, 20, 21)) for i in range(3)]
    golden = Baseline.from_runs(runs, (REWARD,))
    assert golden.moving[CLIP][3] == 2, golden.moving.get(CLIP)  # two steps of the window at 0 in each run
    damped = zero_at(lab_like("damped", 70), CLIP, (5, 6, 8, 9, 10, 11, 12, 14))
    verdict = curves.compare(damped, golden)
    (said,) = [v for v in verdict.failures if v.statistic == "stuck"]
    assert (said.metric, said.where, said.value) == (CLIP, "8 of steps 5-14", 0.0) and not verdict.passed
    assert "0 at 8 of the 10 steps it logged in 5-14" in said.detail and "8 fail" in said.detail, said.detail
    assert "the policy barely moved" in said.detail
    # 7 steps at 0 in the window (a slow clean seed's starved batches), and a run that clips nothing once it has
    # converged (from step 11), pass
    slow = zero_at(lab_like("c", 71), CLIP, (5, 6, 8, 9, 11, 12, 14))
    assert curves.compare(slow, golden).passed
    assert curves.compare(zero_at(lab_like("c", 72), CLIP, range(11, 31)), golden).passed
    # a run stopped at step 9 logged 5 of the window's steps: four fifths of them (4) is not enough, STUCK_STEPS is
    short = curves.compare(zero_at(lab_like("c", 74, steps=9), CLIP, (5, 6, 7, 8)), golden)
    assert not [v for v in short.failures if v.statistic == "stuck"], short.message()
    # other shares at 0 throughout the window, judged as moving measurements (of 2**40 tokens: no value repeats): a
    # value function's or dual-clip's lower clip fraction, the response length's clip ratio (what generation made)
    for other in ("critic/vf_clipfrac", "actor/pg_clipfrac_lower", "response_length/clip_ratio"):
        others = Baseline.from_runs([zero_at(r, other, (6, 20), 2**40) for r in runs], (REWARD,))
        assert other in others.moving, other
        assert curves.compare(zero_at(lab_like("c", 73), other, range(5, 15), 2**40), others).passed, other
    # a window moved later holds runs that have converged: their rests at 0 there are not counted
    moved = {REWARD: dataclasses.replace(default_tolerance(REWARD), window=(21, 30))}
    late = zero_at(lab_like("late", 75), CLIP, range(21, 29))
    assert curves.compare(late, Baseline.from_runs(runs, (REWARD,), moved)).passed
    # the golden's runs: twice the median run's count and more than the most. A golden of more runs holds a slow seed
    # more often (one at 4 of 10 among runs at 2): twice the most (9) let the damped run pass
    slow_one = [zero_at(lab_like("s0", 10), CLIP, (5, 6, 8, 9)), *runs,
                *(zero_at(lab_like(f"s{i}", 10 + i), CLIP, (6, 9)) for i in (1, 2))]
    wider = Baseline.from_runs(slow_one, (REWARD,))
    assert wider.moving[CLIP][3:] == (4, 2)
    said = [v for v in curves.compare(damped, wider).failures if v.statistic == "stuck"]
    assert [v.metric for v in said] == [CLIP] and "at most 4 of them, the median run 2" in said[0].detail, said
    # a recipe whose runs rest more (the median run at 4 of 10) allows 8; a golden run at 8 allows 8
    often = Baseline.from_runs([zero_at(r, CLIP, (5, 6, 8, 9, 20)) for r in runs], (REWARD,))
    assert often.moving[CLIP][3:] == (4, 4) and curves.compare(damped, often).passed
    assert not curves.compare(zero_at(lab_like("d9", 76), CLIP, range(5, 14)), often).passed
    eight = Baseline.from_runs([zero_at(lab_like("s8", 11), CLIP, (5, 6, 8, 9, 10, 11, 12, 14)), *runs], (REWARD,))
    assert eight.moving[CLIP][3:] == (8, 2) and curves.compare(damped, eight).passed
    # seeded bugs
    limit = bl.stuck_limit
    monkeypatch.setattr(curves, "stuck_limit", lambda longest, steps, clip_rests=False, typical=None, share=None:
                        limit(longest, steps, clip_rests))  # twice the most, as before the median
    assert curves.compare(damped, wider).passed
    monkeypatch.undo()
    monkeypatch.setattr(bl, "CLIP_REST_SHARE", fractions.Fraction(bl.STUCK_STEPS, 10))
    assert not curves.compare(slow, golden).passed
    monkeypatch.undo()
    monkeypatch.setattr(bl, "CLIP_REST_WINDOW", (21, 30))
    assert not curves.compare(late, Baseline.from_runs(runs, (REWARD,), moved)).passed
    monkeypatch.undo()
    bounds = bl.rest_bounds
    monkeypatch.setattr(bl, "rest_bounds", lambda metric, low, high, clip_rests=False: bounds(metric, low, high))
    assert curves.compare(damped, Baseline.from_runs(runs, (REWARD,))).passed
    monkeypatch.undo()
    monkeypatch.setattr(bl, "is_update_clip", lambda metric, low, high: False)
    assert CLIP not in Baseline.from_runs(runs, (REWARD,)).moving


def test_a_recipe_calibrates_its_own_clip_rest_floor(monkeypatch, tmp_path, capsys):
    """The clip fraction's floor (CLIP_REST_SHARE, 8 of the window's 10 steps) is the lab's calibrated tail; a recipe
    whose clean runs clip nothing more often (false alarms of 2-11 % at one reference run, simulated) or less often
    (the graded-reward lab, no clean seed above 5 of 10, where damped-updates rests at 6 or more in 18 of 20 seeds)
    fits its own: scripts/calibrate-curves fits a beta-binomial to its calibration runs' counts (fit_clip_rest_share)
    and writes the share into the calibration, `baseline record --calibration` into the golden's clip-fraction
    tolerance (`rest_share`), and curves.stuck judges with it. Seeded bug: the golden's share ignored, so a run at 6
    of 10 passes a recipe whose floor is 6."""
    from harness.metrics import baseline as bl

    fit = bl.fit_clip_rest_share
    # the recipe before 2026-12-08, its calibration seeds 0-99 (docs/curves.md "The clip fraction's rests"): the prior,
    # at 0.16 %
    lab = [0] * 31 + [1] * 31 + [2] * 15 + [3] * 14 + [4] * 6 + [5] + [7] * 2
    assert fit(lab, 10) == bl.CLIP_REST_SHARE
    # the graded-reward lab (--format-credit 0.5 --init-seed 0), its seeds 0-99: 6 of 10
    assert fit([0] * 46 + [1] * 31 + [2] * 18 + [3] * 4 + [5], 10) == fractions.Fraction(6, 10)
    # a recipe whose clean runs clip nothing at 3-6 of 10: nothing below 10 of 10 holds the tail
    assert fit([3, 4, 5, 6] * 10, 10) == 1
    assert fit([8, 9, 10] * 10, 10) == fractions.Fraction(11, 10)  # above 1: the count never fails
    assert fit([10] * 20, 10) == fractions.Fraction(11, 10)  # every run at rest throughout (found by review: a crash)
    assert fit([3] * 20, 10) == fractions.Fraction(8, 10)  # seeds alike: binomial, 3 of 10 on average
    assert fit([0] * 20, 10) == fractions.Fraction(bl.STUCK_STEPS, 10)  # never at rest: the least count judged
    assert fit(lab[:bl.CLIP_REST_MIN_RUNS - 1], 10) is None  # too few runs: the prior

    def zero_at(run: Run, at) -> Run:
        rng = random.Random(run.name)
        steps = run[REWARD].steps
        return with_series(run, CLIP, [0.0 if t in at else round((0.2 + rng.gauss(0, 0.02)) * 256) / 256
                                       for t in steps], steps)

    runs = [zero_at(lab_like(f"r{i}", i), (6, 9, 20, 21)) for i in range(3)]
    own = {CLIP: dataclasses.replace(default_tolerance(CLIP), rest_share=0.6)}
    golden = Baseline.from_runs(runs, (REWARD, CLIP), own)
    prior = Baseline.from_runs(runs, (REWARD, CLIP))
    six = zero_at(lab_like("six", 80), (5, 7, 8, 10, 12, 13))

    def stuck(candidate, against):
        return [v for v in curves.compare(candidate, against).failures if v.statistic == "stuck"]
    said = stuck(six, golden)
    assert [(v.metric, v.where) for v in said] == [(CLIP, "6 of steps 5-14")] and "6 fail" in said[0].detail, said
    assert not stuck(six, prior) and not stuck(zero_at(lab_like("five", 81), (5, 7, 8, 10, 12)), golden)
    never = Baseline.from_runs(runs, (REWARD, CLIP), {CLIP: dataclasses.replace(own[CLIP], rest_share=1.1)})
    assert not stuck(zero_at(lab_like("all", 82), range(5, 15)), never)
    # stored with the golden, absent from one without it (a harness before the field reads it), checked on load
    path = golden.save(tmp_path / "g.json")
    assert load_baseline(path).metrics[CLIP].tolerance.rest_share == 0.6
    assert "rest_share" not in json.loads(prior.save(tmp_path / "p.json").read_text())["metrics"][CLIP]["tolerance"]
    doc = json.loads(path.read_text())
    for bad in (0, -0.5, 2.5, "0.6"):
        doc["metrics"][CLIP]["tolerance"]["rest_share"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(BadInput, match="rest_share"):
            load_baseline(path)
    # baseline record takes it from a calibration, or from --tolerance
    logs = [_write(tmp_path / f"r{i}.jsonl", r) for i, r in enumerate(runs)]
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"inflation": {REWARD: [2.0, 2.2, 1.4]}, "rest_share": {CLIP: 0.6}}))
    assert cli_main(["baseline", "record", *logs, "--out", str(tmp_path / "c.json"), "--calibration", str(cal)]) == 0
    assert load_baseline(tmp_path / "c.json").metrics[CLIP].tolerance.rest_share == 0.6
    assert cli_main(["baseline", "record", *logs, "--out", str(tmp_path / "t.json"),
                     "--tolerance", f"{CLIP}:rest_share=0.7"]) == 0
    assert load_baseline(tmp_path / "t.json").metrics[CLIP].tolerance.rest_share == 0.7
    capsys.readouterr()
    for bad in ({CLIP: 3}, {REWARD: 0.6}, {"val/clipfrac": 0.6}, []):  # out of range; not the update's; no object
        cal.write_text(json.dumps({"inflation": {REWARD: [2.0, 2.2, 1.4]}, "rest_share": bad}))
        assert cli_main(["baseline", "record", *logs, "--out", str(tmp_path / "x.json"), "--calibration",
                         str(cal)]) == 2
        assert "rest_share" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    assert cli_main(["baseline", "record", *logs, "--out", str(tmp_path / "x.json"),
                     "--tolerance", f"{REWARD}:rest_share=0.7"]) == 2
    assert "other metrics have none" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    # seeded bug: the golden's share ignored
    limit = bl.stuck_limit
    monkeypatch.setattr(curves, "stuck_limit", lambda longest, steps, clip_rests=False, typical=None, share=None:
                        limit(longest, steps, clip_rests, typical))
    assert not stuck(six, golden)


def test_the_moving_metrics_round_trip_and_older_goldens_check_none(tmp_path):
    golden = Baseline.from_runs([with_kl(lab_like(f"r{i}", i), i) for i in range(3)], (REWARD,))
    path = golden.save(tmp_path / "g.json")
    assert load_baseline(path).moving == golden.moving
    doc = json.loads(path.read_text())
    del doc["moving"]  # a golden recorded before the rule
    path.write_text(json.dumps(doc))
    assert load_baseline(path).moving == {}
    doc["moving"] = {KL: [0.0, 1.0]}  # recorded before the longest stretch: only metrics that never repeated
    path.write_text(json.dumps(doc))
    assert load_baseline(path).moving == {KL: (0.0, 1.0, 1, 1, None)}
    doc["moving"] = {KL: [0.0, 1.0, 3]}  # recorded before the count: unknown, and it round-trips as it was
    path.write_text(json.dumps(doc))
    assert load_baseline(path).moving == {KL: (0.0, 1.0, 3, None, None)}
    load_baseline(path).save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())["moving"] == {KL: [0.0, 1.0, 3]}
    doc["moving"] = {KL: [0.0, 1.0, 3, 4]}  # recorded before the median: judged against twice the most, as it was
    path.write_text(json.dumps(doc))
    assert load_baseline(path).moving == {KL: (0.0, 1.0, 3, 4, None)}
    for bad in ([1.0, 0.0], [0.0, 1.0, 1.5], [0.0, 1.0, -1], [0.0, 1.0, 3, 0], [0.0, 1.0, 3, None],
                [0.0, 1.0, 1, 1, 2], [0.0, 1.0, 1, 2, -1], [0.0, 1.0, 1, 2, None], [0.0, 1.0, 1, 2, 1, 1]):
        doc["moving"] = {KL: bad}
        path.write_text(json.dumps(doc))
        with pytest.raises(BadInput, match="moving.*lowest, highest, longest stretch, most at one value"):
            load_baseline(path)


def test_stuck_judges_what_the_golden_vouches_for():
    """Found by review: a gradient norm that stays below 1 is no share, so its exact 0 (a zeroed loss) is still
    stuck; a run longer than the golden may converge after the golden's last step (nothing left to learn) and is
    not judged there; a metric at float noise (|value| < 1e-6: fp32 rollout/actor agreement) never moves in the
    rule's sense; a run too short for the rule is said not judged, never passed."""
    from harness.metrics.baseline import FLOAT_NOISE

    grad, noise = "actor/grad_norm", "rollout_corr/kl"

    def with_more(run: Run, seed: int, zero_from: int | None = None) -> Run:
        rng = random.Random(seed)
        steps = run[REWARD].steps
        return dataclasses.replace(run, series={
            **with_kl(run, seed).series,
            grad: Series(steps, tuple(0.0 if zero_from and t >= zero_from else rng.uniform(0.1, 0.5) for t in steps)),
            noise: Series(steps, tuple(rng.gauss(0, FLOAT_NOISE / 10) for _ in steps))})

    golden = Baseline.from_runs([with_more(lab_like(f"r{i}", i, steps=20), i) for i in range(3)], (REWARD,))
    assert grad in golden.moving and noise not in golden.moving and golden.moving[grad][1] < 1
    zeroed = curves.compare(with_more(lab_like("zeroed", 60, steps=20), 60, zero_from=6), golden)
    assert [(v.metric, v.where) for v in zeroed.failures if v.statistic == "stuck"] == [(grad, "steps 6-20")]
    longer = curves.compare(with_more(lab_like("longer", 61, steps=30), 61, zero_from=18), golden)
    assert not [v for v in longer.failures if v.statistic == "stuck"], longer.message()  # 3 of its zeros <= 20
    short = curves.compare(with_more(lab_like("short", 62, steps=STUCK_STEPS - 1), 62), golden)
    (said,) = [v for v in short.verdicts if v.statistic == "stuck"]
    assert said.passed is None and "run too short" in said.detail
