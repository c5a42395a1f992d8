"""Seeded algorithmic regressions for verl's real trainer at the tiny scale: the upgrade-gate self-test that the
reward-curve alignment fails a run that stops learning, or learns under another algorithm.

Most are verl's own overrides (harness.config.cpu_tier.TRAINER_FAULTS: appended after the recipe's, and Hydra
takes the last value of a key); what no override can do is registered here as a verl advantage estimator
(verl/trainer/ppo/core_algos.py `register_adv_est`; verl 0.9.1's V1 trainer looks a non-builtin estimator up in
that registry: trainer/ppo/ray_trainer.py `compute_advantage`, its `else` branch). harness.launch.verl_cpu
registers them in every verl process of the CPU tier; they are selected only by `launch --fault`. Each wraps
verl's own `compute_grpo_outcome_advantage` (verl 0.9.1 core_algos.py), so the fault is the only difference.
"""
from __future__ import annotations

ZERO = "harness_zero_advantages"  # GRPO advantages times 0: the loss no longer carries any learning signal
FLIPPED = "harness_flipped_advantages"  # GRPO advantages times -1: the policy learns to do worse
# GRPO advantages x 1/20 (a loss or advantage scale lost in a refactor, e.g. a sum turned into a mean over 20
# responses): Adam and the grad clip hide most of it from the reward curve; the gradient's size shows it.
SMALL = "harness_small_advantages"
SMALL_FACTOR = 1 / 20
# The group baseline lost: every response is its own group (the prompt uid lost, e.g. regenerated per response
# after the repeat). verl's compute_grpo_outcome_advantage gives a group of one mean 0 and std 1
# (core_algos.py, verl 0.9.1: `if len(id2score[idx]) == 1`), so the advantage is the raw outcome reward:
# REINFORCE without a baseline, every response of a mostly-failing batch pushed down.
NO_BASELINE = "harness_no_group_baseline"


def register_estimators() -> None:
    """Register the seeded estimators (idempotent)."""
    import numpy as np
    from verl.trainer.ppo import core_algos

    def scaled(factor: float):
        def estimator(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                      norm_adv_by_std_in_grpo: bool = True, config=None, **_kwargs):
            advantages, returns = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config)
            return advantages * factor, returns * factor

        return estimator

    def ungrouped(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                  norm_adv_by_std_in_grpo: bool = True, config=None, **_kwargs):
        alone = np.arange(len(index))  # one group per response: verl's groups of one have no baseline
        return core_algos.compute_grpo_outcome_advantage(token_level_rewards, response_mask, alone, epsilon,
                                                         norm_adv_by_std_in_grpo, config)

    estimators = {ZERO: scaled(0.0), FLIPPED: scaled(-1.0), SMALL: scaled(SMALL_FACTOR), NO_BASELINE: ungrouped}
    for name, fn in estimators.items():
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(fn)
