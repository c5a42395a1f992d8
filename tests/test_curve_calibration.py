"""The curve statistics on the tiny DAPO lab, against the committed golden (baselines/tiny/dapo_lab.json: the
curves of seeds 0-4): baselines of 1, 2 and 3 runs keep false alarms low on seeds they do not contain, one
reference run catches a fault, the calibration the code uses is the measured one, and a run of a golden seed
reproduces that seed exactly (the lab is deterministic per seed) while a fault run of the same seed does not.

Small but real: the candidates are the session's held-out lab run (seed 1234, shared with the suites) and each
golden seed left out of its reference sets. The full measurement (calibration on seeds 0-99; every N-subset of 20
held-out seeds for N = 1, 2, 3, 5; every lab fault) is scripts/calibrate-curves; its numbers are in the README.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.cpu_tier import PATCHED_FAULTS, STOP_LEARNING_FAULTS
from harness.lab import FAULTS, LabConfig, run_lab
from harness.metrics import curves
from harness.metrics.baseline import EXTRA_INFLATION, NOISE_INFLATION, Baseline, fit_clip_rest_share, load_baseline
from harness.metrics.ingest import load_run

# The targets the calibration is held to (scripts/calibrate-curves measures them on 25 held-out seeds): mean false
# alarms <= 5 % from 3 reference runs on, <= 10 % with 1 or 2.
MAX_FALSE_ALARM_RATE = {1: 0.10, 2: 0.10, 3: 0.05, 5: 0.05}
CALIBRATION = Path(__file__).resolve().parent.parent / "baselines" / "tiny" / "curve_calibration.json"
# scripts/calibrate-curves --from: the verl golden's prior measured on the tiny verl recipe's own clean runs
VERL_MEASUREMENT = CALIBRATION.with_name("verl_prior_measurement.json")
# scripts/calibrate-curves --prior on the lab: goldens as `baseline record` makes them for an uncalibrated recipe
LAB_PRIOR_MEASUREMENT = CALIBRATION.with_name("lab_prior_measurement.json")
# the recipe options calibrate-curves records (`lab_recipe`): both lab measurements are of the lab's default recipe
LAB_RECIPE = ("gbs", "n", "ppo_mini_batch_size", "warm_start", "init_seed", "format_credit")
EXACT_STEPS = 4


@pytest.fixture(scope="module")
def golden() -> Baseline:
    from fixtures.dapo import TINY_LAB_GOLDEN

    return load_baseline(TINY_LAB_GOLDEN)


@pytest.mark.parametrize("n_runs", [1, 2, 3])
def test_few_run_baselines_keep_false_alarms_low(golden, tiny_lab_run, n_runs):
    """Every n-subset of the golden's seeds against the session's held-out seed and each golden seed it leaves out:
    one and two reference runs are judged too (by their step noise), within the calibration's targets."""
    n = golden.n_runs
    comparisons = [(keep, tiny_lab_run) for keep in itertools.combinations(range(n), n_runs)]  # seed 1234
    runs = golden.as_runs()
    for left_out in range(n):
        others = [i for i in range(n) if i != left_out]
        comparisons += [(keep, runs[left_out]) for keep in itertools.combinations(others, n_runs)]
    alarms = []
    for keep, candidate in comparisons:
        alignment = curves.compare(candidate, golden.subset(keep))
        assert alignment.state != curves.NOT_COMPARED
        if not alignment.passed:
            alarms.append(f"{candidate.name} vs {alignment.baseline}: {alignment.failures[0].message()}")
    rate = len(alarms) / len(comparisons)
    assert rate <= MAX_FALSE_ALARM_RATE[n_runs], (f"{len(alarms)} of {len(comparisons)} clean runs flagged:\n"
                                                   + "\n".join(alarms))


def test_one_reference_run_catches_a_fault_run(golden, tmp_path):
    """One golden seed alone catches the lab's stale-absorbed fault (the seed 001 bug) on a run of another seed."""
    fault = load_run(run_lab(LabConfig(steps=EXACT_STEPS, seed=77, fault="stale-absorbed"), tmp_path / "stale"))
    alignment = curves.compare(fault, golden.subset([0]))
    assert not alignment.passed and "training/rollout_probs_diff_mean" in {v.metric for v in alignment.failures}


def test_the_five_run_golden_passes_the_held_out_seed_and_its_own_self_check(golden, tiny_lab_run):
    assert curves.compare(tiny_lab_run, golden).passed
    check = golden.provenance["self_check"]
    assert check["runs"] == golden.n_runs and check["false_alarm_rate"] <= MAX_FALSE_ALARM_RATE[3]


# Issue 31's targets for the full measurement: <= 5 % mean false alarms at every N, with and without seeded spikes,
# and no golden flagging more than 2 candidates in 10.
HELD_OUT_MAX_FALSE_ALARM_RATE = 0.05


def test_each_tiny_golden_judges_with_its_recipes_measured_inflation():
    """A golden stores the tolerances it was recorded with, so each must carry its own recipe's measured inflation
    (dapo_verl.json once kept a reward-trend inflation of 1.2 after the calibration moved; a clean verl run of a CI
    host failed that trend by 0.0006). The lab golden carries the lab's calibration (curve_calibration.json,
    measured on seeds the held-out ones are not; scripts/calibrate-curves --golden retunes it). The verl golden
    carries the code's prior: measured on the verl recipe's own 21 clean runs (VERL_MEASUREMENT) it false-alarms
    0.7 % with 5 runs and 0.06 % with 10, while (measured at micro batch 1) the lab's calibration -- a recipe whose
    seeds take off at different steps -- widened the reward window until a frozen optimizer passed it (caught on its
    stuck KL alone), and a calibration on 11 verl runs false-alarmed more than the prior on the 10 others."""
    from fixtures.dapo import TINY_GOLDEN, TINY_LAB_GOLDEN

    doc = json.loads(CALIBRATION.read_text())
    assert not set(doc["calibration_seeds"]) & set(doc["held_out_seeds"]) and len(doc["held_out_seeds"]) >= 20
    for metric, ref in load_baseline(TINY_LAB_GOLDEN).metrics.items():
        # the metrics judged beside the five (EXTRA_TOLERANCES) keep the widest prior until they are calibrated
        expected = doc["inflation"].get(metric, list(EXTRA_INFLATION))
        assert list(ref.tolerance.inflation) == expected, (metric, ref.tolerance)
        # and its clip-rest floor, the fit of the calibration seeds' counts it records (fit_clip_rest_share)
        assert ref.tolerance.rest_share == doc["rest_share"].get(metric), metric
    for metric, share in doc["rest_share"].items():
        counts = [int(c) for c, runs in doc["rest_counts"][metric].items() for _ in range(runs)]
        assert len(counts) == len(doc["calibration_seeds"]) and float(fit_clip_rest_share(counts, 10)) == share, metric
    measured = json.loads(VERL_MEASUREMENT.read_text())
    for metric, ref in load_baseline(TINY_GOLDEN).metrics.items():
        assert list(ref.tolerance.inflation) == list(NOISE_INFLATION.get(metric, EXTRA_INFLATION)), metric
        assert ref.tolerance.rest_share is None, metric  # nobody calibrated the verl recipe: the prior
        assert measured["inflation"][metric] == list(ref.tolerance.inflation), metric


def test_the_default_prior_is_narrower_than_the_tiny_recipes_own():
    """NOISE_INFLATION is the prior of a recipe nobody calibrated (seed 001's one-run case must stay detectable:
    tests/test_curves.py); the tiny recipe's bimodal seeds measured wider on every reward statistic."""
    doc = json.loads(CALIBRATION.read_text())
    reward = "critic/rewards/mean"
    assert all(d <= m for d, m in zip(NOISE_INFLATION[reward], doc["inflation"][reward], strict=True))


def test_a_retuned_golden_keeps_every_other_tolerance(golden):
    inflation = {m: (9.0, 8.0, 7.0) for m in golden.metrics}
    retuned = golden.retuned(inflation)
    for metric, ref in retuned.metrics.items():
        before = golden.metrics[metric].tolerance
        assert ref.tolerance.inflation == (9.0, 8.0, 7.0)
        assert ref.tolerance.with_inflation(before.inflation) == before
        assert ref.runs == golden.metrics[metric].runs
    assert [r.meta.extra["seed"] for r in retuned.as_runs()] == golden.provenance["seeds"]


def test_the_measured_calibration_meets_the_targets():
    """scripts/calibrate-curves' calibration of the lab's recipe (baselines/tiny/curve_calibration.json: the graded
    reward from one initial policy since 2026-12-08), measured on seeds the calibration never saw, meets issue 31's
    targets with and without seeded spikes: mean false alarms <= 5 % at every N, every rollout fault caught at every
    N, and so is a run whose advantage, loss or optimizer stops (on 20 fault seeds), named by two statistics or more.
    A run on a quarter of the updates is caught by at least 80 % of goldens at every N, on the steps of the window its
    KL rests at (seeded bug: judging rests in a row only caught it in 16-18 %), and one on damped updates (every
    update a quarter of its size, 70 % of the gain, no KL rest) by at least 90 %, on its clip fraction's rests at 0
    against the recipe's fitted floor, 6 of 10 (seeded bugs: that 0 a bound, as a converged run's: at most 0.3 %
    in the recipe before; the lab's four fifths: 80 % at the defaults, lab_prior_measurement.json). Not met, and
    said in docs/curves.md: one one-run golden of 20 flags 4 of the other 19 held-out seeds (no golden above 2 in 10
    from N = 2 on), and half-updates (75 % of the gain) is caught by 8-14 % of goldens. Every lab fault has a row: a
    fault added later is measured, not left out."""
    doc = json.loads(CALIBRATION.read_text())
    assert doc["lab_recipe"] == {k: getattr(LabConfig(), k) for k in LAB_RECIPE}  # the one the lab golden is of
    assert doc["rest_share"] == {"actor/pg_clipfrac": 0.6}
    # issue 31: the same targets with one seeded spike (3-10x the median) in 1 of 5 runs, and over the spiked
    # candidates alone (one grad-norm spike made 40 % of them false-alarm at N=5)
    for key in ("measurements", "measurements_spiked"):
        rows = {row["n_runs"]: row for row in doc[key]}
        for n in MAX_FALSE_ALARM_RATE:
            limit = HELD_OUT_MAX_FALSE_ALARM_RATE
            assert rows[n]["false_alarm_mean"] <= limit, (key, rows[n])
            assert rows[n]["goldens_above_2_in_10"] <= (1 if n == 1 else 0), (key, rows[n])
            if key == "measurements_spiked":
                assert rows[n]["false_alarm_spiked_candidates"] <= limit, (key, rows[n])
        rollout = [f for f, spec in FAULTS.items() if f != "none" and spec.trainer_fault is None]
        caught = (*rollout, *STOP_LEARNING_FAULTS)
        assert all(rows[n]["detection"][f] == 1.0 for n in rows for f in caught), (key, rows)
        assert all(row["named_by_one"].get(f, 0) == 0 for row in rows.values() for f in STOP_LEARNING_FAULTS)
        assert all(row["detection"]["quarter-updates"] >= 0.8 for row in rows.values()), (key, rows)
        assert all(row["detection"]["damped-updates"] >= 0.9 for row in rows.values()), (key, rows)
        assert all(set(row["detection"]) == set(FAULTS) - {"none"} for row in rows.values())  # every fault measured
    assert doc["spikes"]["seeded"] and all(3 <= s["factor"] <= 10 for s in doc["spikes"]["seeded"])


def test_the_labs_goldens_at_the_defaults_catch_every_run_that_stops_learning():
    """The same held-out lab seeds and fault seeds, goldens as `baseline record` makes them for a recipe nobody
    calibrated (`calibrate-curves --prior`): a run that stops learning, whichever part of the trainer stops it, fails
    every golden at every N, named by two statistics or more (seeded bug: the stuck rule that judged no KL once a
    golden run rested at 0 caught a frozen optimizer in 78 / 70 / 69 / 54 %), every rollout fault too, and false
    alarms stay within 5 % at every N with no golden above 2 in 10, with and without seeded spikes (seeded bug: the
    prior's grad-norm trend inflation at 1.0, not 1.7: 5.3 % at N = 1; the recipe before 2026-12-08, math_dapo's
    score from a policy per seed, whose bimodal seeds left 1 golden of 20 and 1 of 40 above 2 in 10 at N = 1 and 2).
    The run on damped updates is caught by 80 % of goldens or more at every N, on its clip fraction's rests at 0 and
    its reward (the recipe before: 64-68 %; seeded bug: the count's limit at twice the most golden run's, not its
    median: 35 % at N = 5 there), and the one on a quarter of them by every golden. Not met, and said in
    docs/curves.md: the run that learns on half of the updates (75 % of the gain) is caught by 8-16 % of goldens."""
    doc = json.loads(LAB_PRIOR_MEASUREMENT.read_text())
    assert doc["prior"] is True and doc["applied"] is None and doc["inflation_measured"] is None
    assert {m: doc["inflation"][m] for m in NOISE_INFLATION} == {m: list(v) for m, v in NOISE_INFLATION.items()}
    assert not set(doc["held_out_seeds"]) & set(doc["fault_seeds"]) and len(doc["fault_seeds"]) >= 20
    assert doc["lab_recipe"] == {k: getattr(LabConfig(), k) for k in LAB_RECIPE}  # the one the lab golden is of
    rollout = [f for f, spec in FAULTS.items() if f != "none" and spec.trainer_fault is None]
    for key in ("measurements", "measurements_spiked"):
        rows = {row["n_runs"]: row for row in doc[key]}
        assert sorted(rows) == [1, 2, 3, 5]
        for n, row in rows.items():
            assert all(row["detection"][f] == 1.0 for f in (*rollout, *STOP_LEARNING_FAULTS)), (key, n, row)
            assert all(row["named_by_one"].get(f, 0) == 0 for f in STOP_LEARNING_FAULTS), (key, n, row)
            assert row["detection"]["quarter-updates"] >= 0.8, (key, n, row)
            assert row["detection"]["damped-updates"] >= 0.8, (key, n, row)
            assert set(row["detection"]) == set(FAULTS) - {"none"}  # every lab fault measured
            assert row["false_alarm_mean"] <= HELD_OUT_MAX_FALSE_ALARM_RATE, (key, n, row)
            assert row["goldens_above_2_in_10"] == 0, (key, n, row)


@pytest.mark.parametrize("fault, reproduces", [("none", True), ("stale-absorbed", False)])
def test_a_golden_seed_reproduces_exactly_and_a_fault_does_not(golden, tmp_path, fault, reproduces):
    """Bit for bit on a host with the golden's kernels, within ULPs on any other (the golden's host fingerprint
    decides, and the verdict says which); the stale-absorbed fault fails either way."""
    from harness.config import host

    seed = golden.provenance["seeds"][0]
    run = load_run(run_lab(LabConfig(steps=EXACT_STEPS, seed=seed, fault=fault), tmp_path / f"lab-{fault}"))
    alignment = curves.compare_exact(run, golden, allow_partial=True)
    assert alignment.passed is reproduces, alignment.message()
    same = host.same_kernels(run.meta.extra["host"], golden.provenance.get("host"))
    assert ("bit for bit: same CPU kernels" if same else "not bit for bit") in alignment.message()
    if not reproduces:  # the stale absorbed weights show in the rollout/actor mismatch from the first steps
        failed = {v.metric: v for v in alignment.failures}
        assert "training/rollout_probs_diff_mean" in failed and "first divergent step" in failed[
            "training/rollout_probs_diff_mean"].detail


def test_the_lab_is_bit_for_bit_deterministic_on_one_host(tmp_path):
    """Two runs of one seed on this host agree bit for bit, whatever the host (the golden may come from another)."""
    runs = [load_run(run_lab(LabConfig(steps=3, seed=7), tmp_path / f"lab-s7-{i}")) for i in range(2)]
    golden = Baseline.from_runs([runs[0]])
    alignment = curves.compare_exact(runs[1], golden)
    assert alignment.passed and "bit for bit: same CPU kernels" in alignment.message(), alignment.message()



def test_the_verl_goldens_prior_holds_on_verls_own_runs():
    """scripts/calibrate-curves --from on 21 clean runs of verl's real trainer (the tiny recipe; the prior was fitted to
    none of them) and on runs with each fault patched into verl (seeds no golden holds), goldens drawn as `baseline
    record` makes them: mean false alarms at most 5 % at every number of reference runs, with and without seeded spikes
    (at micro batch 1 one reference run false-alarmed 5.0 %, 5.5 % with spikes), and no golden flags more than 2 seeds
    in 10, with or without spikes (seeded bugs: a noise model worth the count of its differences, stats.EFFECTIVE_DF:
    one of 21 one-run goldens flagged 7 of 20; spikes measured against the run's own noise alone,
    stats.SPIKE_NOISE_CONFIDENCE: with seeded spikes one golden of 210 and one of 300 flagged 4 seeds of 19 and 18);
    every golden catches every run that stops learning by at least 2 statistics (seeded bug: the update's clip
    fraction at 0 a bound, as a converged run's: a frozen optimizer named by one alone in 1-8 % of goldens of 1-3
    runs), every run on a quarter of the updates, and every run on damped updates (57-77 % of the gain kept), on its
    clip fraction's rests at 0 (the same seeded bug: 35-76 %). What it does not meet is in docs/curves.md:
    half-updates (81-85 % of the ten-run golden's gain kept on the runs measured, the clean seeds' own 76-115 %) is
    caught by 0-4 % of goldens."""
    doc = json.loads(VERL_MEASUREMENT.read_text())
    assert doc["prior"] is True and doc["inflation_measured"] is None and doc["inflation_from_prior"]
    assert len(doc["runs_from"]["clean"]) >= 20
    assert all(len(doc["runs_from"]["faults"][f]) >= 3 for f in PATCHED_FAULTS)  # scripts/tiny-verl-runs makes each
    from fixtures.dapo import TINY_GOLDEN

    for key in ("measurements", "measurements_spiked"):
        rows = {row["n_runs"]: row for row in doc[key]}
        # what users record, and the committed golden's own size (the seeded bug: a golden re-recorded from another
        # number of runs than its false alarms were measured at)
        assert sorted(rows) == sorted({1, 2, 3, 5, load_baseline(TINY_GOLDEN).n_runs})
        for n, row in rows.items():
            assert row["false_alarm_mean"] <= HELD_OUT_MAX_FALSE_ALARM_RATE, (key, n, row)
            assert row["goldens_above_2_in_10"] == 0, (key, n, row)
            assert all(row["detection"][f] == 1.0 for f in (*STOP_LEARNING_FAULTS, "quarter-updates",
                                                            "damped-updates")), (key, n, row)
            assert all(row["fewest_statistics"][f] >= 2 for f in STOP_LEARNING_FAULTS), (key, n, row)


# What the tiny verl golden can tell apart on the reward alone (20 noise draws each, step noise 0.15 around the
# golden's centre with the reward gain cut to a fraction). Recorded with the code's prior (the verl recipe's own
# clean runs keep its false alarms low: VERL_MEASUREMENT), a run keeping half the gain or less fails every draw,
# as its power table says (reward-window MDE 0.47, half the gain 0.67); three quarters of it passes. With the lab's
# calibration the micro-batch-1 golden was WEAK (window tolerance 0.85): a quarter of the gain failed 4 draws of 20
# and half of it none. On the real trainer (docs/curves.md) frozen-optimizer keeps 41-58 % of the gain and fails;
# half-updates keeps 68-92 % and failed the goldens of 2026-12-06 and 2026-12-07 on 1 of the 9 runs judged.
@pytest.mark.parametrize("learned, flagged", [(0.0, 20), (0.25, 20), (0.5, 20), (0.75, 0), (1.0, 0)])
def test_the_verl_golden_fails_a_run_keeping_half_its_gain_and_passes_one_keeping_three_quarters(learned, flagged):
    """The tiny verl golden against its own centre curve with the reward gain cut to `learned` plus seeded step
    noise: a run that does not learn, or keeps a quarter or half of the gain, fails every draw on the reward alone;
    three quarters of the gain and the full gain fail none."""
    import random

    from fixtures.dapo import TINY_GOLDEN
    from harness.metrics.keys import REWARD
    from harness.metrics.run import Series

    golden = load_baseline(TINY_GOLDEN)
    run, centre = golden.as_runs()[0], golden.metrics[REWARD].series()
    failed = []
    for draw in range(20):
        rng = random.Random(draw)
        values = tuple(centre.values[0] + learned * (c - centre.values[0]) + rng.gauss(0, 0.15) for c in centre.values)
        candidate = dataclasses.replace(run, name=f"gain x{learned} draw {draw}",
                                        series={**run.series, REWARD: Series(centre.steps, values)})
        alignment = curves.compare(candidate, golden)
        if not alignment.passed:
            assert {v.metric for v in alignment.failures} == {REWARD}, alignment.message()
            failed.append(alignment)
    assert len(failed) == flagged, [a.message() for a in failed[:2]]


def test_the_verl_measurement_runs_are_made_once_each_and_resumed(tmp_path):
    """scripts/tiny-verl-runs makes VERL_MEASUREMENT's runs (21 clean seeds, every patched fault on seeds 700-702) in
    the layout `calibrate-curves --from` reads. It takes about 2.5 hours, so a stopped one resumes: a finished run is
    never made again, the one that failed is made again from scratch. The launcher is a stand-in `python` that
    records each launch, refuses a run directory that exists (as `launch --run-dir` does) and fails the 7th; `-c`
    (the fault list) goes to this interpreter."""
    from harness.config.cpu_tier import PATCHED_FAULTS

    root = Path(__file__).resolve().parents[1]
    log, runs = tmp_path / "launches", tmp_path / "runs"
    shim = tmp_path / "python"
    shim.write_text(f"""#!/bin/sh
[ "$1" = -c ] && exec {sys.executable} "$@"
echo "$*" >> {log}
for last; do :; done
[ -e "$last" ] && echo "$last: already holds a run" >&2 && exit 4
mkdir -p "$last" && echo half-written > "$last/metrics.jsonl"
[ "$(wc -l < {log})" -eq 7 ] && [ ! -e {tmp_path}/failed-once ] && touch {tmp_path}/failed-once && exit 3
exit 0
""")
    shim.chmod(0o755)

    def make() -> subprocess.CompletedProcess:
        return subprocess.run([str(root / "scripts" / "tiny-verl-runs"), str(runs)], cwd=root, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHON": str(shim)})

    first = make()
    assert first.returncode == 3, first.stderr  # the 7th launch failed: the script stops there
    assert len(log.read_text().splitlines()) == 7
    again = make()
    assert again.returncode == 0, again.stderr
    launches = log.read_text().splitlines()
    expected = [("clean", s) for s in (0, 1, 2, 3, 4, *range(700, 715), 1234)]
    expected += [(f, s) for f in PATCHED_FAULTS for s in (700, 701, 702)]
    made = [(line.split("--run-dir ")[1].split("/")[-2], int(line.split("--seed ")[1].split()[0])) for line in launches]
    made_of = dict(zip(made, launches, strict=True)).get
    assert made == expected[:7] + expected[6:], "every run once, the failed 7th again"
    for (kind, _), line in zip(made, launches, strict=True):
        assert ("--fault " + kind in line) is (kind != "clean") and "--scale tiny --local" in line
    assert sorted(p.name for p in runs.iterdir()) == sorted({"clean", *PATCHED_FAULTS})
    # calibrate-curves --from reads every entry of a kind's directory as a run, except a dot-name (the marks)
    assert all(p.is_dir() for kind in runs.iterdir() for p in kind.iterdir() if not p.name.startswith("."))
    assert make().returncode == 0 and len(log.read_text().splitlines()) == len(launches)  # all done: nothing rerun
    shutil.rmtree(runs / "clean" / "verl-s1234")
    (runs / "clean" / ".verl-s1234.done").unlink()
    rerun = make()  # one run removed: that one alone is made again
    assert rerun.returncode == 0 and log.read_text().splitlines()[len(launches):] == [made_of(("clean", 1234))]
