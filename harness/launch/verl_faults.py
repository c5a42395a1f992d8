"""Seeded algorithmic regressions for verl's real trainer at the tiny scale: the upgrade-gate self-test that the
reward-curve alignment fails a run that stops learning, or learns under another algorithm.

Most are verl's own overrides (harness.config.cpu_tier.TRAINER_FAULTS: appended after the recipe's, and Hydra
takes the last value of a key); what no override can do is registered here as a verl advantage estimator
(verl/trainer/ppo/core_algos.py `register_adv_est`; verl 0.9.1's V1 trainer looks a non-builtin estimator up in
that registry: trainer/ppo/ray_trainer.py `compute_advantage`, its `else` branch). harness.launch.verl_cpu
registers them in every verl process of the CPU tier; they are selected only by `launch --fault`.
"""
from __future__ import annotations

ZERO = "harness_zero_advantages"  # GRPO advantages times 0: the loss no longer carries any learning signal
FLIPPED = "harness_flipped_advantages"  # GRPO advantages times -1: the policy learns to do worse


def register_estimators() -> None:
    """Register the seeded estimators (idempotent)."""
    from verl.trainer.ppo import core_algos

    def scaled(factor: float):
        def estimator(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                      norm_adv_by_std_in_grpo: bool = True, config=None, **_kwargs):
            advantages, returns = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config)
            return advantages * factor, returns * factor

        return estimator

    for name, factor in ((ZERO, 0.0), (FLIPPED, -1.0)):
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(scaled(factor))
