"""The seeded advantage estimators of the real-trainer regression self-test (harness.launch.verl_faults), on verl's
own registry and GRPO: each does to the advantages exactly what its fault says and nothing else, and every one a
TRAINER_FAULTS override names is registered. Seconds, no trainer: the verl runs that judge them are
tests/test_tiny_verl.py::test_the_alignment_fails_a_seeded_regression_on_the_real_trainer."""
from __future__ import annotations

import numpy as np
import pytest

from harness.config import cpu_tier
from harness.launch import verl_faults

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
LR = 0.1  # the stand-in worker's learning rate: a full step moves each weight by it


@pytest.fixture(scope="module")
def batch():
    """Two prompts x four responses, DAPO-like outcome rewards (+1 / -1, one overlong -1.5) on the last token."""
    scores = torch.tensor([1.0, -1.0, -1.0, -1.5, -1.0, -1.0, 1.0, 1.0])
    mask = torch.ones(8, 3)
    rewards = torch.zeros(8, 3)
    rewards[:, -1] = scores
    index = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    return rewards, mask, index, scores


def _advantages(name, batch):
    verl_faults.register_estimators()
    rewards, mask, index, _ = batch
    advantages, _ = core_algos.get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask,
                                                           index=index, config=None)
    return advantages


def _grpo(batch):
    rewards, mask, index, _ = batch
    return core_algos.compute_grpo_outcome_advantage(rewards, mask, index)[0]


@pytest.mark.parametrize("name, factor", [(verl_faults.ZERO, 0.0), (verl_faults.FLIPPED, -1.0),
                                          (verl_faults.SMALL, 1 / 20)])
def test_scaled_estimators_scale_verls_grpo_advantages(batch, name, factor):
    assert torch.allclose(_advantages(name, batch), _grpo(batch) * factor)


def test_no_group_baseline_is_the_raw_outcome_reward(batch):
    """Each response its own group: verl gives a group of one mean 0 and std 1, so the advantage is the reward
    itself, where GRPO's is centred per prompt (its group means are -0.625 and 0)."""
    _, mask, _, scores = batch
    lost = _advantages(verl_faults.NO_BASELINE, batch)
    assert torch.allclose(lost, scores.unsqueeze(-1) / (1 + 1e-6) * mask)
    grpo = _grpo(batch)
    assert abs(float(grpo[:4, -1].sum())) < 1e-5 and float(lost[:4, -1].sum()) < -2  # the baseline is gone
    assert not torch.allclose(lost, grpo)


def test_every_estimator_a_trainer_fault_names_is_registered():
    verl_faults.register_estimators()
    verl_faults.register_estimators()  # idempotent: every verl process calls it once per import
    named = {o.split("=", 1)[1] for overrides in cpu_tier.TRAINER_FAULTS.values() for o in overrides
             if o.startswith("algorithm.adv_estimator=")}
    assert named == {verl_faults.ZERO, verl_faults.FLIPPED, verl_faults.SMALL, verl_faults.NO_BASELINE}
    assert named <= set(core_algos.ADV_ESTIMATOR_REGISTRY)


@pytest.fixture
def registries():
    """verl's estimator and policy-loss registries and its two estimators called by name, restored after a test
    patches them."""
    saved = dict(core_algos.ADV_ESTIMATOR_REGISTRY), dict(core_algos.POLICY_LOSS_REGISTRY)
    by_name = {name: getattr(core_algos, name) for name in ("compute_grpo_outcome_advantage",
                                                            "compute_gae_advantage_return")}
    yield
    for name, fn in by_name.items():
        setattr(core_algos, name, fn)
    for registry, entries in zip((core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY), saved,
                                 strict=True):
        registry.clear()
        registry.update(entries)


def _worker_module():
    """A module holding a TrainingWorker as `patch_trainer` sees verl's (workers/engine_workers.py): an engine with
    an optimizer, and `train_mini_batch` stepping it once per mini-batch (two here) on the loss verl's policy-loss
    registry gives, as workers/utils/losses.py `ppo_loss` does."""
    from types import SimpleNamespace

    from verl.workers.config import ActorConfig

    config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=2)

    class TrainingWorker:
        def __init__(self):
            self.logp = torch.zeros(2, 1, requires_grad=True)
            # at ratio 1 the policy loss's gradient is the constant -advantage / 2, so each Adam step (no weight
            # decay) moves every weight by exactly the learning rate: a step's size is its share of a full one
            self.engine = SimpleNamespace(optimizer=torch.optim.AdamW([self.logp], lr=LR, weight_decay=0.0))

        def train_mini_batch(self):
            losses, moved = [], []
            for _ in range(2):
                loss, _ = core_algos.get_policy_loss_fn("vanilla")(
                    self.logp.detach(), self.logp, torch.tensor([[1.0], [0.5]]), torch.ones(2, 1),
                    loss_agg_mode="token-mean", config=config)
                loss.backward()
                before = self.logp.detach().clone()
                self.engine.optimizer.step()
                self.engine.optimizer.zero_grad()
                losses.append(float(loss.detach()))
                moved.append(round(float((self.logp.detach() - before).abs().max()) / LR, 4))
            return losses, moved

    return SimpleNamespace(TrainingWorker=TrainingWorker)


@pytest.mark.parametrize("fault", cpu_tier.PATCHED_FAULTS)
def test_each_patched_fault_acts_on_verls_code_from_its_step(fault, registries, batch):
    """A fault patched into verl's code (the real-trainer self-test of a run that stops learning, whichever part
    stops it) is healthy for FAULT_FROM_STEP steps, then does what it says and nothing else: the advantages verl's
    registry computes are 0, or the policy loss it returns is 0, or the actor's optimizer skips every step, or
    all but the first of each 2 or 4, or moves the weights a quarter of each step's way. Patching twice acts once
    (every verl import runs it). Seeded: an onset off by a step, a fault acting on another part, or a double patch
    (half-updates skipping 3 of 4, damped-updates moving a sixteenth) fails."""
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    module, imported = _worker_module(), []

    def after_import(name, patch):
        imported.append(name)
        patch(module)

    for _ in range(2):
        verl_faults.patch_trainer(fault, after_import)
    assert set(imported) <= {"verl.workers.engine_workers"}
    rewards, mask, index, _ = batch
    worker, seen = module.TrainingWorker(), []
    for _ in range(cpu_tier.FAULT_FROM_STEP + 2):
        # verl's own compute_advantage, as its V1 trainer calls it once per step: GRPO by module attribute
        data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                                   non_tensors={"uid": index})
        advantages = compute_advantage(data, AdvantageEstimator.GRPO).batch["advantages"]
        losses, moved = worker.train_mini_batch()
        seen.append((bool(advantages.any()), all(loss != 0 for loss in losses), moved))
    healthy = (True, True, [1.0, 1.0])
    keep = cpu_tier.UPDATES_KEPT.get(fault, 1)  # the optimizer faults step the first update of each `keep`
    scale = cpu_tier.UPDATE_SCALE.get(fault, 1.0)  # or each a share of its way
    moved = [scale if keep is not None and i % keep == 0 else 0.0 for i in range(4)]
    if fault == "dead-loss":  # Adam's momentum still moves the weights, less each step
        seen = [(a, nonzero, [m > 0 for m in moves]) for a, nonzero, moves in seen]
        healthy, moved = (True, True, [True, True]), [True] * 4
    live = [(fault != "zero-advantage", fault != "dead-loss", moved[:2]), (fault != "zero-advantage",
            fault != "dead-loss", moved[2:])]
    assert seen == [healthy] * cpu_tier.FAULT_FROM_STEP + live, seen
    reinforce, _ = core_algos.get_adv_estimator_fn("reinforce_plus_plus")(  # every other estimator, by registry
        token_level_rewards=rewards, response_mask=mask, config=AlgoConfig())
    assert bool(reinforce.any()) == live[0][0]


def test_the_patched_sites_are_where_verl_runs_them(monkeypatch):
    """What `patch_trainer` relies on, read from the installed verl: the actor's update is one
    `TrainingWorker.train_mini_batch` call per step, its optimizer is the engine's, and the loss looks its policy
    loss up by name at call time. A verl that moved them would leave a patched fault silently inert."""
    import inspect

    from verl.workers import engine_workers
    from verl.workers.utils import losses

    assert "self.actor.train_mini_batch(" in inspect.getsource(engine_workers.ActorRolloutRefWorker.update_actor)
    assert "self.engine" in inspect.getsource(engine_workers.TrainingWorker.train_mini_batch)
    assert "get_policy_loss_fn(" in inspect.getsource(losses.ppo_loss)
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    assert "self.optimizer.step()" in inspect.getsource(FSDPEngine.optimizer_step)
    monkeypatch.delenv(cpu_tier.TRAINER_PATCH_ENV, raising=False)
    assert verl_faults.trainer_patch() is None
    monkeypatch.setenv(cpu_tier.TRAINER_PATCH_ENV, "frozen-optimiser")
    with pytest.raises(ValueError, match="HARNESS_TRAINER_PATCH='frozen-optimiser': use one of zero-advantage"):
        verl_faults.trainer_patch()
