"""The memory knobs of a job's overrides (harness.config.job): which the analytic model reads, and which it cannot.

The plan, lengths and batch reach the model through `job.scale` (harness.config.job.derive_scale); the rest of what
changes memory maps onto MemoryOptions here. Every override whose key is memory-relevant (MEMORY_RELEVANT) and is
neither read here nor by derive_scale is listed as not modelled, with its value, so a verdict never silently
ignores a setting.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.config.job import Job, _value, derive_scale
from harness.errors import BadInput
from harness.memory.phases import MemoryOptions

_A, _RO, _REF, _MG = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref",
                      "actor_rollout_ref.actor.megatron")
# override key -> (MemoryOptions field, kind)
OPTION_KEYS: dict[str, tuple[str, type]] = {
    f"{_MG}.param_offload": ("param_offload", bool),
    f"{_MG}.grad_offload": ("grad_offload", bool),  # cann-recipes-train's fork; verl 0.9.1 folds it into param_offload
    f"{_MG}.optimizer_offload": ("optimizer_offload", bool),
    f"{_RO}.gpu_memory_utilization": ("gpu_memory_utilization", float),
    f"{_RO}.max_num_batched_tokens": ("max_num_batched_tokens", int),
    f"{_RO}.max_num_seqs": ("max_num_seqs", int),
    f"{_RO}.log_prob_micro_batch_size_per_gpu": ("log_prob_micro_batch", int),
    f"{_REF}.log_prob_micro_batch_size_per_gpu": ("ref_micro_batch", int),
}
ENV_KEYS = {"HCCL_BUFFSIZE": ("hccl_buffsize_mb", int)}
# Values the model's coefficients already assume (seed 001's activation model is sequence parallel on).
ASSUMED = {f"{_MG}.sequence_parallel": True}
# Keys an engine does not read: verl 0.9.1's Megatron engine takes recompute from override_transformer_config only
# (workers/engine/megatron/ never reads model.enable_gradient_checkpointing).
NO_EFFECT = {"megatron": ("actor_rollout_ref.model.enable_gradient_checkpointing",)}
# Keys that change a device's memory. Matched against every override; one derive_scale or OPTION_KEYS does not read
# is reported as not modelled.
MEMORY_RELEVANT = tuple(re.compile(p) for p in (
    r".*_parallel_size", r".*pipeline_parallel_num_layer_list", r".*num_layers_in_(first|last)_pipeline_stage",
    r".*\.recompute_.*", r".*activations_checkpoint_.*", r".*enable_gradient_checkpointing",
    r".*(param|grad|optimizer)_offload", r".*offload_policy", r".*enable_activation_offload", r".*swap_optimizer",
    r".*sequence_parallel", r".*use_distributed_optimizer",
    r".*micro_batch_size(_per_gpu)?", r".*use_dynamic_bsz", r".*max_token_len(_per_gpu)?", r"data\.train_batch_size",
    r".*ppo_mini_batch_size", r"data\.max_(prompt|response)_length", rf"{re.escape(_RO)}\.n",
    rf"{re.escape(_RO)}\.(gpu_memory_utilization|max_num_batched_tokens|max_num_seqs|max_model_len|"
    r"enable_chunked_prefill|kv_cache_dtype|enable_prefix_caching|free_cache_engine|quantization|dtype|"
    r"enforce_eager|cudagraph_capture_sizes)",
    r".*entropy_from_logits_with_chunking", r".*entropy_checkpointing", r"trainer\.(nnodes|n_gpus_per_node)",
    r".*megatron\.dtype", r".*fsdp_config\.(dtype|model_dtype)",
))


@dataclass(frozen=True)
class JobMemory:
    """MemoryOptions of a job, the overrides they came from, and what the model could not take into account."""

    options: MemoryOptions
    modelled: tuple[str, ...] = ()
    unmodelled: tuple[str, ...] = field(default=())


def memory_options(job: Job, base: MemoryOptions | None = None) -> JobMemory:
    """`base` (default MemoryOptions()) with the job's memory overrides and HCCL_BUFFSIZE applied."""
    base = base or MemoryOptions()
    changes, modelled = {}, []
    for key, (name, kind) in OPTION_KEYS.items():
        if key in job.values:
            changes[name] = _typed(key, job.values[key], kind)
            modelled.append(f"{key}={job.values[key]}")
    for key, (name, kind) in ENV_KEYS.items():
        if key in job.env:
            changes[name] = _typed(f"env {key}", job.env[key], kind)
            modelled.append(f"{key}={job.env[key]}")
    swap = f"{_MG}.swap_optimizer"
    if swap in job.values and _typed(swap, job.values[swap], bool):
        # MindSpeed v2.3.0_core_r0.12.1 docs/features/swap-optimizer.md: the fp32 master weights and Adam moments
        # live on the host during forward/backward, the step streams 1/swap_optimizer_times (16) of them at a time:
        # off the device at every peak this model computes
        changes["optimizer_offload"] = True
        modelled.append(f"{swap}=True (as optimizer offload: MindSpeed swap-optimizer)")
    if f"{_MG}.param_offload" in job.values and f"{_MG}.grad_offload" not in job.values:
        # verl 0.9.1 trainer/config/engine/megatron.yaml: param_offload "offload model parameters to CPU and release
        # gradient buffers while inactive"
        changes["grad_offload"] = changes["param_offload"]
    read = set(derive_scale(job.scale, job.values).read) | set(modelled)
    unmodelled = list(job.unmodelled)
    for key, value in job.values.items():
        if f"{key}={value}" in read or not any(p.fullmatch(key) for p in MEMORY_RELEVANT):
            continue
        if key in ASSUMED and _value(key, value) == ASSUMED[key]:
            continue
        if key == swap or key in NO_EFFECT.get(str(job.values.get("model_engine")), ()):
            continue
        if job.user is not None and key not in job.user.override_map():
            continue  # the scale's own settings are what the model was built for
        unmodelled.append(f"{key}={value}")
    from dataclasses import replace

    return JobMemory(replace(base, **changes), tuple(modelled), tuple(unmodelled))


def _typed(key: str, text: str, kind: type):
    value = _value(key, text)
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind:
        raise BadInput(f"override {key}={text}: {kind.__name__} expected")
    return value
