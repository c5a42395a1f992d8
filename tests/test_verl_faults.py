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
