"""Seeded algorithmic regressions for verl's real trainer at the tiny scale: the upgrade-gate self-test that the
reward-curve alignment fails a run that stops learning, or learns under another algorithm.

Most are verl's own overrides (harness.config.cpu_tier.TRAINER_FAULTS: appended after the recipe's, and Hydra
takes the last value of a key); what no override can do is registered here as a verl advantage estimator
(verl/trainer/ppo/core_algos.py `register_adv_est`; verl 0.9.1's V1 trainer looks a non-builtin estimator up in
that registry: trainer/ppo/ray_trainer.py `compute_advantage`, its `else` branch). harness.launch.verl_cpu
registers them in every verl process of the CPU tier; they are selected only by `launch --fault`. Each wraps
verl's own `compute_grpo_outcome_advantage` (verl 0.9.1 core_algos.py), so the fault is the only difference.

`patch_trainer` patches the others into verl's own code instead (harness.config.cpu_tier.PATCHED_FAULTS, selected by
TRAINER_PATCH_ENV in the job's environment): the run's settings and resolved config stay the clean run's, as a bug
in an upgraded trainer would leave them, so only its curves can tell.
"""
from __future__ import annotations

import functools
import os

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


def trainer_patch() -> str | None:
    """The patched trainer fault this verl process runs (None: a clean trainer); an unknown name is refused."""
    from harness.config.cpu_tier import PATCHED_FAULTS, TRAINER_PATCH_ENV

    fault = os.environ.get(TRAINER_PATCH_ENV) or None
    if fault is not None and fault not in PATCHED_FAULTS:
        raise ValueError(f"{TRAINER_PATCH_ENV}={fault!r}: use one of {', '.join(PATCHED_FAULTS)}")
    return fault


class _Onset:
    """Steps this process has trained or computed advantages for: a fault starts after FAULT_FROM_STEP healthy
    steps (harness.config.cpu_tier), the run learning first and then stopping (the lab's onset)."""

    def __init__(self) -> None:
        self.steps = 0
        self.busy = False  # inside an advantage estimator (one that calls another counts one step)

    @property
    def live(self) -> bool:
        from harness.config.cpu_tier import FAULT_FROM_STEP

        return self.steps >= FAULT_FROM_STEP


def patch_trainer(fault: str, after_import) -> None:
    """Patch `fault` into verl's code in this process (idempotent). Where verl 0.9.1 runs each part:
    - zero-advantage: the driver's `compute_advantage` (trainer/ppo/ray_trainer.py; the V1 trainer's through
      trainer/ppo/v1/utils.py `compute_advantage_for_multi_trajectories`), once per step, calls GRPO and GAE as
      module attributes (`core_algos.compute_grpo_outcome_advantage`, `compute_gae_advantage_return`) and every
      other estimator through ADV_ESTIMATOR_REGISTRY, each looked up at call time: all of them return their
      advantages and returns times 0. An estimator calling another counts one step (the outermost call).
    - dead-loss: the actor's loss (workers/utils/losses.py `ppo_loss`) looks its policy loss up the same way in
      POLICY_LOSS_REGISTRY; every policy loss returns loss times 0 (its metrics untouched).
    - frozen-optimizer / half-updates / quarter-updates: the actor's optimizer (engine/fsdp/transformer_impl.py
      `optimizer_step`, `self.optimizer.step()` after the grad clip) takes none of its steps, or the first of each
      2 or 4 (cpu_tier.UPDATES_KEPT); the grad norm is still computed and logged.
    - damped-updates: the same optimizer takes every step, and each moves the weights a quarter of its way
      (cpu_tier.UPDATE_SCALE).
    The worker's steps are counted by `TrainingWorker.train_mini_batch` (workers/engine_workers.py), called once
    per training step for the actor's update (`ActorRolloutRefWorker.update_actor`). `after_import(name, patch)`
    runs `patch` on module `name` once it is imported (harness.launch.verl_cpu._patch_after_import)."""
    from verl.trainer.ppo import core_algos

    onset = _Onset()
    if fault == "zero-advantage":
        def zero(fn):
            def estimator(*args, **kwargs):
                outermost, live, onset.busy = not onset.busy, onset.live, True
                try:
                    advantages, returns = fn(*args, **kwargs)
                finally:
                    if outermost:
                        onset.busy, onset.steps = False, onset.steps + 1
                return (advantages * 0, returns * 0) if live else (advantages, returns)
            return estimator

        _wrap_registry(core_algos.ADV_ESTIMATOR_REGISTRY, zero)
        for name in ("compute_grpo_outcome_advantage", "compute_gae_advantage_return"):
            _wrap_attribute(core_algos, name, zero)
        return
    if fault == "dead-loss":
        def dead(fn):
            def policy_loss(*args, **kwargs):
                loss, metrics = fn(*args, **kwargs)
                return (loss * 0 if onset.live else loss), metrics
            return policy_loss

        _wrap_registry(core_algos.POLICY_LOSS_REGISTRY, dead)
    after_import("verl.workers.engine_workers", functools.partial(_count_worker_steps, fault=fault, onset=onset))


def _wrapped(fn, wrap):
    if getattr(fn, "harness_fault", False):
        return fn
    out = functools.wraps(fn)(wrap(fn))
    out.harness_fault = True
    return out


def _wrap_registry(registry: dict, wrap) -> None:
    for name, fn in list(registry.items()):
        registry[name] = _wrapped(fn, wrap)


def _wrap_attribute(module, name: str, wrap) -> None:
    setattr(module, name, _wrapped(getattr(module, name), wrap))


def _count_worker_steps(module, *, fault: str, onset: _Onset) -> None:
    """Count the actor's training steps in `TrainingWorker.train_mini_batch` (wrapped keeping verl's @register
    dispatch attributes); with an optimizer fault, skip its optimizer's steps while the fault is live (all but the
    first of each cpu_tier.UPDATES_KEPT[fault], or every one), or damp each (cpu_tier.UPDATE_SCALE[fault])."""
    from harness.config.cpu_tier import UPDATE_SCALE, UPDATES_KEPT

    def counted(train):
        def train_mini_batch(self, *args, **kwargs):
            if onset.live and fault in UPDATES_KEPT:
                _skip_steps(self.engine.optimizer, keep_one_in=UPDATES_KEPT[fault])
            if onset.live and fault in UPDATE_SCALE:
                _damp_steps(self.engine.optimizer, scale=UPDATE_SCALE[fault])
            try:
                return train(self, *args, **kwargs)
            finally:
                onset.steps += 1
        return train_mini_batch

    _wrap_attribute(module.TrainingWorker, "train_mini_batch", counted)


def _wrap_step(optimizer, wrap) -> None:
    """optimizer.step = wrap(optimizer.step), once (every train_mini_batch of a live fault calls this)."""
    if getattr(optimizer.step, "harness_fault", False):
        return
    wrapped = wrap(optimizer.step)
    wrapped.harness_fault = True
    optimizer.step = wrapped


def _skip_steps(optimizer, *, keep_one_in: int | None) -> None:
    def wrap(step):
        calls = [0]

        def skipping(*args, **kwargs):  # the first of each `keep_one_in` runs, the others are skipped (the lab's)
            calls[0] += 1
            return step(*args, **kwargs) if keep_one_in and (calls[0] - 1) % keep_one_in == 0 else None
        return skipping

    _wrap_step(optimizer, wrap)


def _damp_steps(optimizer, *, scale: float) -> None:
    """Each step of `optimizer` moves its parameters `scale` of the way it would (cpu_tier.damped_step)."""
    from harness.config.cpu_tier import damped_step

    _wrap_step(optimizer, lambda step: lambda *args, **kwargs: damped_step(
        optimizer, lambda: step(*args, **kwargs), scale))
