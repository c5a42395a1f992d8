"""verl's GRPO advantage is each response's outcome reward, centred on its group's mean and scaled by its std.

The tiny DAPO lab (harness.lab.loop) calls verl's own `compute_grpo_outcome_advantage` with its defaults, and verl's
trainer passes `algorithm.norm_adv_by_std_in_grpo` from its shipped config. An upgrade that flips either default
(Dr. GRPO's unscaled advantage, arXiv 2503.20783, is one keyword away) or loses the group baseline moves every
reward curve with no override showing why; the curve suites then say MISALIGNED without naming it. This is the
cheapest oracle of the upgrade gate (harness.gate): a second, on the definition, in milliseconds.

The definition (GRPO, arXiv 2402.03300 eq. 3): A_i = (r_i - mean(r_g)) / (std(r_g) + eps) over the responses of one
prompt, with verl 0.9.1's conventions (core_algos.py compute_grpo_outcome_advantage): the unbiased std
(torch.std), eps 1e-6, a group of one has mean 0 and std 1, and the advantage is broadcast over the response mask.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

EPS = 1e-6


def _reference(scores: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    out = torch.empty_like(scores)
    for uid in set(index.tolist()):
        members = torch.tensor([i for i, u in enumerate(index.tolist()) if u == uid])
        group = scores[members]
        mean, std = (group.mean(), group.std()) if len(group) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out[members] = (group - mean) / (std + EPS)
    return out


@pytest.mark.tiny
@pytest.mark.cpu
def test_verl_grpo_advantage_is_the_group_normalised_reward(record_property):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    generator = torch.Generator().manual_seed(0)
    groups, n, length = 6, 8, 5
    scores = torch.randint(0, 2, (groups * n,), generator=generator).float() * 2 - 1  # math_dapo's +-1 rewards
    scores[:n] = 1.0  # a group that agrees: advantage 0, not a division by zero
    index = np.repeat(np.array([f"p{g}" for g in range(groups)], dtype=object), n)
    mask = torch.ones(groups * n, length)
    mask[:, 3:] = torch.randint(0, 2, (groups * n, 2), generator=generator).float()
    rewards = torch.zeros(groups * n, length)
    rewards[:, 0] = scores  # outcome reward on one token: the advantage sums the row
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask, index)  # as the lab calls it: defaults
    expected = _reference(scores, index).unsqueeze(-1) * mask
    error = (advantages - expected).abs().max().item()
    centred = (scores - scores.view(groups, n).mean(1).repeat_interleave(n)).unsqueeze(-1) * mask
    unscaled = (advantages - centred).abs().max().item()  # 0 when verl returns Dr. GRPO's unscaled advantage
    record_property("advantage.max_abs_error", error)
    assert torch.equal(advantages, returns), "GRPO's returns are its advantages"
    assert error < 1e-5, (f"verl's compute_grpo_outcome_advantage is {error:.3g} off the group-normalised reward "
                          f"({unscaled:.3g} off the unscaled Dr. GRPO form): did its norm_adv_by_std_in_grpo default "
                          "or its group baseline change?")


@pytest.mark.tiny
@pytest.mark.cpu
def test_verl_config_scales_the_grpo_advantage_by_std():
    """verl's trainer takes the switch from its shipped config (ray_trainer.compute_advantage)."""
    from harness.config.recipe import compose, dapo_recipe
    from harness.config.scales import get_scale

    config = compose(dapo_recipe(get_scale("tiny")))
    assert config.algorithm.norm_adv_by_std_in_grpo is True, (
        "verl's shipped algorithm.norm_adv_by_std_in_grpo is no longer True: the GRPO/DAPO advantage is unscaled "
        "(Dr. GRPO) unless the recipe sets it")
