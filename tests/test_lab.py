"""Self-tests of the tiny DAPO lab against the committed golden (baselines/tiny/dapo_lab.json, seeds 0-4):
every fault flag is caught by `compare`, clean seeds are not (false positives), the clean run learns,
and it writes verl's FileLogger format with verl's metric keys.

Cost: fault and false-positive runs are short (FAULT_STEPS / FP_STEPS steps, ~0.5-1.5 s per step here);
`compare(...)` then evaluates the per-step band over the steps they have and skips
(never passes) the window/trend statistics they have not reached. The full 30-step numbers come from
`python -m harness.lab` + `ascend-rl-harness compare`, run by hand.
"""
from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.lab import FAULTS, LabConfig, run_lab
from harness.metrics import curves
from harness.metrics.baseline import load_baseline
from harness.metrics.ingest import load_run
from harness.metrics.keys import METRICS_FILE

FAULT_STEPS = 4
FP_STEPS = 4
FP_SEEDS = range(100, 110)  # independent of the golden's seeds 0-4 and the suite's 1234


@pytest.fixture(scope="module")
def golden():
    from fixtures.dapo import TINY_LAB_GOLDEN

    return load_baseline(TINY_LAB_GOLDEN)


def _short_run(tmp_path_factory, steps: int, seed: int, fault: str):
    out = run_lab(LabConfig(steps=steps, seed=seed, fault=fault), tmp_path_factory.mktemp(f"{fault}-s{seed}") / "run")
    return load_run(out)


@pytest.mark.parametrize("fault", [f for f, how in FAULTS.items() if f != "none" and how.trainer_fault is None])
def test_each_fault_is_flagged_by_compare(fault, golden, tmp_path_factory):
    run = _short_run(tmp_path_factory, FAULT_STEPS, 0, fault)
    alignment = curves.compare(run, golden)
    failed = {(v.metric, v.statistic) for v in alignment.failures}
    # At tiny scale the stale/scale faults barely move the reward in 4 steps; the rollout/actor probability
    # mismatch shows them at once (measured: clean ~1e-7, faults 1e-3..1e-1).
    assert ("training/rollout_probs_diff_mean", "band") in failed, alignment.summary()
    assert not alignment.passed
    diff = run["training/rollout_probs_diff_mean"].values
    assert max(diff) > 1e-3, f"{fault}: rollout_probs_diff_mean peaks at {max(diff):.3g}, expected > 1e-3"


def test_clean_seeds_are_not_flagged(golden, tmp_path_factory):
    false_positives = []
    for seed in FP_SEEDS:
        alignment = curves.compare(_short_run(tmp_path_factory, FP_STEPS, seed, "none"), golden)
        if not alignment.passed:
            false_positives.append(alignment.summary() + ": " + "; ".join(v.message() for v in alignment.failures))
    assert not false_positives, f"{len(false_positives)} of {len(FP_SEEDS)} clean seeds flagged:\n" + "\n".join(
        false_positives)


def test_clean_run_learns_and_writes_verl_filelogger(tiny_lab_run, golden):
    reward = tiny_lab_run["critic/rewards/mean"]
    # measured: about -1.6 at step 1 (overlong penalty on random responses) to 0..+0.6 by step 25-30
    first, last = reward.values[0], sum(reward.values[-6:]) / 6
    assert last - first > 1.0, f"reward went {first:.3f} -> {last:.3f} (mean of the last 6 steps); expected a rise > 1"
    assert max(tiny_lab_run["training/rollout_probs_diff_mean"].values) < 1e-5  # clean sync: float noise only
    path = tiny_lab_run.meta.sources[0]
    assert path.endswith(METRICS_FILE)
    first_line = json.loads(open(path).readline())
    assert set(first_line) == {"step", "data"} and first_line["step"] == 1  # verl FileLogger record shape
    for key in golden.metrics:
        assert key in first_line["data"], f"lab does not log verl's {key}"
    assert tiny_lab_run.meta.scale == "tiny" and "verl" in tiny_lab_run.meta.versions


def test_the_mini_batch_sets_the_updates_per_step(tmp_path):
    """`--mini-batch` (issue 43's lever: a larger batch that lowers the noise without more optimizer updates per
    step) reaches the trainer: with --gbs 4 and --mini-batch 2 each step takes two optimizer updates, with 4 one.
    Seeded: the flag parsed and dropped (LabConfig's default 4 for both) counts one update for each."""
    import torch

    updates = {}
    for mini in (2, 4):
        real = torch.optim.AdamW.step
        calls = []

        def counted(self, *a, _real=real, _calls=calls, **k):
            _calls.append(1)
            return _real(self, *a, **k)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.optim.AdamW, "step", counted)
            assert main(["lab", "--steps", "1", "--seed", "7", "--gbs", "4", "--n", "4", "--mini-batch", str(mini),
                         "--out", str(tmp_path / f"m{mini}")]) == 0
        meta = json.loads((tmp_path / f"m{mini}" / "meta.json").read_text())
        assert meta["lab"]["ppo_mini_batch_size"] == mini
        updates[mini] = len(calls)
    assert updates[2] == 2 * updates[4] > 0, updates


def test_the_format_credit_grades_wrong_answers_in_format(tmp_path):
    """`--format-credit` (issue 43's graded reward): a wrong digit then EOS scores -1 + the credit, a right one +1
    and anything else math_dapo's -1; and the flag reaches the lab's reward, so step 1 (the same first rollout: the
    reward does not steer it) scores higher. Seeded: the flag parsed and dropped scores both runs alike."""
    from harness.config.task import graded_score

    # as DAPORewardManager passes them: the response without its EOS ("" is an EOS alone; "32=" ran to the cap)
    scores = {s: graded_score("tiny", s, "3", format_credit=0.5)["score"] for s in ("3", "2", "", "32", "=", "32=")}
    assert scores == {"3": 1.0, "2": -0.5, "": -1.0, "32": -1.0, "=": -1.0, "32=": -1.0}
    reward = {}
    for credit in ("0", "1"):
        assert main(["lab", "--steps", "1", "--seed", "7", "--format-credit", credit,
                     "--out", str(tmp_path / credit)]) == 0
        assert json.loads((tmp_path / credit / "meta.json").read_text())["lab"]["format_credit"] == float(credit)
        reward[credit] = load_run(tmp_path / credit)["critic/rewards/mean"].values[0]
    assert reward["1"] > reward["0"], reward


def test_lab_cli_rejects_bad_input(capsys):
    assert main(["lab", "--steps", "0", "--out", "/nonexistent/never-written"]) == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.parametrize("fault", [f for f, how in FAULTS.items() if how.trainer_fault])
def test_each_trainer_fault_is_live_from_its_step_and_undone_after(fault):
    """The trainer faults (issue 43: a run that stops learning, or learns on fewer or smaller updates) act on the code
    the lab trains with from FAULT_FROM_STEP on, and on nothing after the run. Seeded: a patch that never engages
    (its step count off), damps by another share, or outlives its run (the next clean run would stop learning too)."""
    import torch
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from harness.config.cpu_tier import FAULT_FROM_STEP, UPDATE_SCALE, UPDATES_KEPT
    from harness.lab.loop import _patched

    saved = core_algos.compute_grpo_outcome_advantage, core_algos.get_policy_loss_fn, torch.optim.AdamW.step
    reward = torch.tensor([[1.0], [-1.0]])
    mask, uid = torch.ones(2, 1), __import__("numpy").array(["a", "a"], dtype=object)
    logp = torch.zeros(2, 1, requires_grad=True)
    with _patched(FAULTS[fault].trainer_fault):
        layer = torch.nn.Linear(2, 1)
        # a constant gradient (a linear layer's sum) and no weight decay: each Adam step moves every weight by
        # exactly the learning rate, so a step's size over it is its share of a full one
        optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.0)
        moved = []
        for _ in range(2 * FAULT_FROM_STEP + 4):  # two optimizer steps per lab step
            before = layer.weight.detach().clone()
            layer(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            moved.append(round(float((layer.weight.detach() - before).abs().max()) / 0.1, 4))
        adv, _ = core_algos.compute_grpo_outcome_advantage(reward, mask, uid)
        config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=2)
        loss, _ = core_algos.get_policy_loss_fn("vanilla")(logp.detach(), logp, torch.tensor([[1.0], [1.0]]),
                                                           mask, loss_agg_mode="token-mean", config=config)
    assert moved[:2 * FAULT_FROM_STEP] == [1.0] * 2 * FAULT_FROM_STEP, moved  # healthy before its step
    keep = UPDATES_KEPT.get(fault, 1)  # the optimizer faults: the first update of each `keep` from the onset, as
    # verl's patch (tests/test_verl_faults.py); seeded: an onset a lab step late, or groups counted from step 1
    scale = UPDATE_SCALE.get(fault, 1.0)  # or each at a share of its move
    updates = [scale if keep is not None and i % keep == 0 else 0.0 for i in range(4)]
    live = moved[2 * FAULT_FROM_STEP:] == updates and {
        "zero-advantage": not adv.any(), "dead-loss": float(loss) == 0.0 and bool(adv.any())}.get(fault, True)
    assert live, (fault, moved, adv, loss)
    assert (core_algos.compute_grpo_outcome_advantage, core_algos.get_policy_loss_fn,
            torch.optim.AdamW.step) == saved  # undone


def test_a_warm_start_answers_in_format_and_right_as_often_as_its_mix():
    """`--warm-start` (issue 43's lever: RL from a competent policy, the way real RL starts from a pretrained model)
    leaves every seed answering one digit then EOS, right about 0.2 + 0.8 / 4 = 40 % of the time; the weights the
    rollout is built from are the trained ones. Seeded: a warm start that trained nothing, or handed the engine the
    random init, fails."""
    import torch

    from harness.config.task import DIGITS, EOS_ID, CharTokenizer
    from harness.engines.base import torch_threads
    from harness.lab.loop import build_actor, checkpoint_weights, warm_start

    config = LabConfig(warm_start=150)
    tok = CharTokenizer()
    digit = torch.tensor([tok.encode(ch)[0] for ch in DIGITS])
    a, b = torch.arange(16) // 4, torch.arange(16) % 4
    prompts = torch.stack([digit[a], digit[b], torch.full_like(a, tok.encode("=")[0])], 1)
    with torch_threads(1), torch.no_grad():
        for seed in (600,):  # 601 measured alike; one seed keeps this test cheap
            actor, random_init = build_actor(config.spec(), seed, config.head_scale)
            with torch.enable_grad():
                weights = warm_start(actor, config.spec(), seed, config.warm_start, config.warm_start_correct)
            right = actor(input_ids=prompts).logits[:, -1].softmax(-1).gather(1, digit[a][:, None]).mean()
            eos = actor(input_ids=torch.cat([prompts, digit[a][:, None]], 1)).logits[:, -1].softmax(-1)[:, EOS_ID]
            assert eos.mean() > 0.95 and eos.min() > 0.8 and 0.25 < right < 0.55, (seed, eos, right)
            assert all(torch.equal(weights[name], t) for name, t in checkpoint_weights(actor, config.spec()))
            assert not torch.equal(weights["lm_head.weight"], random_init["lm_head.weight"])


def test_a_trainer_fault_leaves_the_warm_start_alone(tmp_path):
    """A trainer fault acts on the RL run only: with --warm-start, RL starts from the clean run's policy, so the
    first step is the clean run's (the step the fault starts at: test_each_trainer_fault_is_live_from_its_step...).
    Seeded (the bug): the warm start's AdamW steps counted as the run's under the fault's patch, so a frozen-optimizer
    run froze the warm start after its 3rd step and RL began from another policy -- caught at step 1, for the wrong
    reason, not as a run that learns and then stops. Cost: two 1-step runs of 4 x 4 samples with a 5-step warm
    start, ~7 s on a loaded 2-core host."""
    def first_step(fault: str) -> dict:
        run = load_run(run_lab(LabConfig(steps=1, seed=7, fault=fault, gbs=4, n=4, warm_start=5), tmp_path / fault))
        return {key: run[key].values for key in ("critic/rewards/mean", "actor/pg_loss", "actor/grad_norm")}

    assert first_step("frozen-optimizer") == first_step("none")


def test_the_init_seed_is_one_checkpoint_for_every_run_seed(tmp_path):
    """`--init-seed` (issue 43: real RL starts every run from one pretrained checkpoint): two run seeds with one
    init seed build their rollout engines from the same weights, warm start included; without it each seed draws
    its own model. Seeded: the field dropped (the policy drawn from --seed) gives two checkpoints."""
    import torch

    from harness.engines.reference import make_reference_engine
    from harness.lab import LabConfig, run_lab

    built = {}

    def recording(spec, *, weights, **kwargs):  # the reference engine, its starting weights kept
        built.setdefault(kwargs["seed"], {k: v.clone() for k, v in weights.items()})
        return make_reference_engine(spec, weights=weights, **kwargs)

    for seed, init in ((1, 0), (2, 0), (3, None)):
        run_lab(LabConfig(steps=1, seed=seed, init_seed=init, warm_start=5), tmp_path / f"s{seed}",
                make_engine=recording)
    assert built[1].keys() == built[2].keys() == built[3].keys()
    assert all(torch.equal(built[1][k], built[2][k]) for k in built[1])
    assert not all(torch.equal(built[1][k], built[3][k]) for k in built[1])
    # the lab's default since 2026-12-08 is one checkpoint; `--init-seed run` is each run's own (the recipe before)
    from harness.cli import build_parser

    def init_seed(*argv):
        return build_parser().parse_args(["lab", "--out", "x", *argv]).init_seed
    assert LabConfig().init_seed == init_seed() == 0 and init_seed("--init-seed", "run") is None
    assert init_seed("--init-seed", "7") == 7
