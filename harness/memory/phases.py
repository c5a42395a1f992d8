"""Analytic per-phase memory model of a DAPO step (rollout, prefill, old_log_prob, ref_log_prob, update)
for one device of a scale's parallel plan: verdicts for a 256-card job in milliseconds.

Every component is a closed form of the model's dimensions (harness.config.models), the plan (harness.config.plans),
the batch (harness.config.scales) and the device (harness.config.hardware); the constants that are not dimensions
live in `MemoryOptions` (data, not code). The activation coefficients are seed 001's memory model of
Megatron + MindSpeed (TP8 PP16 EP16, SP on), which `tests/test_memory_model.py` reproduces to the
printed digits; the MLA prefill terms are the same closed forms the fake-tensor tracer measures on
HF's real attention (`tests/test_memory_tracer.py` checks they agree).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from harness.config.hardware import GiB
from harness.config.job import check_world
from harness.config.models import ModelSpec
from harness.config.plans import Recompute
from harness.config.platforms import platform_facts
from harness.config.scales import Scale
from harness.errors import BadInput
from harness.findings import Finding

MiB = 1024**2
BF16, FP32 = 2, 4
PHASES = ("rollout", "prefill", "old_log_prob", "ref_log_prob", "update")


# The MemoryOptions fields that are the job's settings (each read from the job, else from verl's default).
JOB_SETTINGS = ("param_offload", "grad_offload", "optimizer_offload", "gpu_memory_utilization", "max_num_seqs",
                "max_num_batched_tokens")


@dataclass(frozen=True)
class MemoryOptions:
    """Knobs of the run that set memory but are not part of a Scale.

    The job's own settings (offloads, vLLM's pool sizing) have no default here: None is "not resolved", and
    harness.memory.job_options.memory_options fills each from the job's overrides, else from the installed verl's
    shipped default (issue 44: these defaulted to seed 001's offloads, so `memory --scale full-a3` judged a job with
    param/grad/optimizer offload while the job it emitted, and verl 0.9.1, had none: PASS at 54 GiB for ~114 GiB)."""

    # verl megatron offload: params/grads live on the host outside the phases that need them;
    # MindSpeed optimizer_cpu_offload / swap-optimizer keeps Adam on the host.
    param_offload: bool | None = None
    grad_offload: bool | None = None
    optimizer_offload: bool | None = None
    # bf16 grad buffers (Megatron DDP without grad_reduce_in_fp32): seed 002's A3 plan holds 11B params
    # per die (8 MoE layers, EP8), which fits 64 GB with bf16 grads and could not with fp32 ones.
    grad_bytes: int = BF16
    optimizer_bytes: int = 3 * FP32  # fp32 master weights + Adam m and v, sharded by the distributed optimizer
    # The actor's logits are vocab-parallel: [tokens, V/TP] on each TP rank. verl 0.9.1's Megatron engine, which every
    # harness recipe runs (model_engine=megatron), computes log-probs and entropy on the TP-sharded logits:
    # verl/workers/engine/megatron/transformer_impl.py `_lm_head_logits_processor` -> `vocab_parallel_entropy` and
    # verl/utils/megatron/tensor_parallel.py `vocab_parallel_log_probs_from_logits` (megatron-core
    # `tensor_parallel.vocab_parallel_cross_entropy`); no rank gathers the full vocabulary. Modelling the full
    # vocabulary per rank (seed 001's 35 GB count) put seed 002's production A3 recipe (120 TPS/card) at 73 GiB in
    # ref_log_prob, a FAIL for a job that ran (issue 30). False models an engine that gathers them (FSDP's TP-less
    # logits are full anyway: shards = CP only).
    vocab_parallel_logits: bool = True
    micro_batch: int | None = None  # None: scale.batch.micro_batch_size_per_device (dynamic bsz packs more)
    # The log-prob phases' own micro batches (verl: rollout.log_prob_micro_batch_size_per_gpu for old_log_prob,
    # ref.log_prob_micro_batch_size_per_gpu for ref_log_prob); None: the training micro batch.
    log_prob_micro_batch: int | None = None
    ref_micro_batch: int | None = None
    max_response_length: int | None = None  # None: scale.batch.max_response_length
    hccl_buffsize_mb: int | None = None  # None: harness.config.recipe.HCCL_BUFFSIZE_MB (the recipe's HCCL_BUFFSIZE)
    # vLLM: the KV pool is what gpu_memory_utilization leaves after weights, non-torch (HCCL) memory
    # and the activation peak of the profiling step (max_num_batched_tokens tokens).
    gpu_memory_utilization: float | None = None  # the job's, else verl's rollout default (job_options)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's explicit KV pool; None: what gpu_memory_utilization leaves
    chunked_prefill: bool | None = None  # None: scale.chunked_prefill
    prefill_chunk: int = 512  # query chunk of the chunked MLA prefill

    def resolve(self, scale: Scale) -> MemoryOptions:
        from harness.config.recipe import HCCL_BUFFSIZE_MB

        unresolved = [name for name in JOB_SETTINGS if getattr(self, name) is None]
        if unresolved:
            # a programming error, not bad input: a verdict must never fall back on a setting the job does not carry
            raise ValueError(f"MemoryOptions {', '.join(unresolved)} not resolved from the job: build them with "
                             "harness.memory.job_options.memory_options(job)")
        micro = self.micro_batch or scale.batch.micro_batch_size_per_device
        return replace(
            self,
            micro_batch=micro,
            log_prob_micro_batch=self.log_prob_micro_batch or micro,
            ref_micro_batch=self.ref_micro_batch or micro,
            max_response_length=self.max_response_length or scale.batch.max_response_length,
            hccl_buffsize_mb=self.hccl_buffsize_mb or HCCL_BUFFSIZE_MB,
            chunked_prefill=scale.chunked_prefill if self.chunked_prefill is None else self.chunked_prefill)


@dataclass(frozen=True)
class PhaseMemory:
    """Peak memory of one phase on the worst device (pipeline stage) of a scale."""

    scale: str
    phase: str
    stage: int | None  # the training pipeline stage that peaks (None for rollout phases)
    components: dict[str, float]  # GiB per component
    budget_gib: float
    headroom_gib: float
    notes: tuple[str, ...] = field(default=())
    # why the phase cannot run whatever its peak: vLLM refuses to start when its KV pool cannot hold one sequence
    # (issue 44: verl's 96 GB A2 example left a 0.00 GiB pool and `memory` said it fits)
    refused: str | None = None

    @property
    def peak_gib(self) -> float:
        return sum(self.components.values())

    @property
    def fits(self) -> bool:
        return self.refused is None and self.peak_gib + self.headroom_gib <= self.budget_gib

    @property
    def largest(self) -> str:
        return max(self.components, key=self.components.get)

    @property
    def ok(self) -> bool:
        return self.fits

    @property
    def where(self) -> str:
        return self.phase if self.stage is None else f"{self.phase} stage {self.stage}"

    def message(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (f"{self.scale} {self.where}: {self.peak_gib:.2f} GiB + {self.headroom_gib:g} GiB headroom {verdict} "
                f"{self.budget_gib:g} GiB; largest {self.largest} {self.components[self.largest]:.2f} GiB"
                + (f"; {self.refused}" if self.refused else "") + "".join(f"; {note}" for note in self.notes))

    def findings(self) -> tuple[Finding, ...]:
        return () if self.fits else (Finding("memory.phase", "kv_cache" if self.refused else self.largest,
                                             self.where, self.message()),)

    def to_json(self) -> dict:
        return {"scale": self.scale, "phase": self.phase, "stage": self.stage,
                "components_gib": {k: round(v, 4) for k, v in self.components.items()},
                "peak_gib": round(self.peak_gib, 4), "budget_gib": self.budget_gib,
                "headroom_gib": self.headroom_gib, "fits": self.fits, "refused": self.refused,
                "notes": list(self.notes)}


# ------------------------------------------------------------------ parameters per device
def vocab_padded(spec: ModelSpec, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * TP."""
    m = divisible_by * tp
    return math.ceil(spec.vocab_size / m) * m


def layer_params_per_device(spec: ModelSpec, layer: int, *, tp: int, ep: int, etp: int = 1,
                            experts_tp_split: bool = False) -> tuple[float, float]:
    """(dense-sharded params, expert params) of one layer on one device.

    Attention, the dense FFN and the shared experts are TP-split; routed experts are EP-split and
    ETP-split in Megatron (`experts_tp_split=False`), while vLLM's EP shards them over the whole
    instance; the router (and norms) are replicated.
    """
    norms = 2 * spec.hidden_size
    # MLA's down projections (q_a, kv_a) and their norms are replicated across TP (Megatron
    # `duplicated` linears, vLLM ReplicatedLinear); q_b, kv_b and o are split.
    h = spec.hidden_size
    replicated = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank
    if spec.q_lora_rank:
        replicated += h * spec.q_lora_rank + spec.q_lora_rank
    dense = replicated + (spec.attention_params() - replicated) / tp + norms
    if layer < spec.first_k_dense_replace:
        return dense + spec.dense_mlp_params() / tp, 0.0
    router = spec.n_routed_experts * spec.hidden_size + spec.n_routed_experts
    dense += spec.n_shared_experts * spec.expert_params() / tp + router
    experts = spec.n_routed_experts / ep * spec.expert_params() / (tp if experts_tp_split else etp)
    return dense, experts


def stage_layers(scale: Scale) -> list[range]:
    t = scale.plan.train
    counts = t.stage_layers or (scale.model.num_hidden_layers // t.pp,) * t.pp
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [range(s, s + c) for s, c in zip(starts, counts, strict=True)]


def train_params(scale: Scale, stage: int) -> tuple[float, float]:
    """(dense, expert) parameter counts of one device of a training pipeline stage."""
    spec, t = scale.model, scale.plan.train
    dense = experts = 0.0
    for layer in stage_layers(scale)[stage]:
        d, e = layer_params_per_device(spec, layer, tp=t.tp, ep=t.ep, etp=t.etp)
        dense, experts = dense + d, experts + e
    embedding = vocab_padded(spec, t.tp) * spec.hidden_size / t.tp
    if stage == 0:
        dense += embedding
    if stage == t.pp - 1:
        dense += embedding + spec.hidden_size  # untied output layer + final norm
    return dense, experts


def rollout_weight_bytes(scale: Scale) -> float:
    """vLLM weights on one device: TP for attention/dense/shared/vocab, EP over the instance for experts."""
    spec, r = scale.model, scale.plan.rollout
    total = 2 * vocab_padded(spec, r.tp, 64) * spec.hidden_size / r.tp + spec.hidden_size
    for layer in range(spec.num_hidden_layers):
        d, e = layer_params_per_device(spec, layer, tp=r.tp, ep=r.ep, experts_tp_split=r.ep == 1)
        total += d + e
    return total * BF16


# ------------------------------------------------------------------ activations (seed 001's model)
# Bytes per layer per token of a TP shard (SP on): coefficient * hidden + 2 bytes of the MLA latent
# (kv_lora_rank + qk_rope_head_dim). Seed 001 (TP8, s*b = 4096): dense 0.15435791 GB, MoE 0.578186035 GB.
ACT_COEF_DENSE = 45
ACT_COEF_MOE = 169


def layer_activation_bytes(spec: ModelSpec, layer: int, *, tokens: int, tp: int, cp: int = 1) -> float:
    """Activations one layer keeps for backward for `tokens` (= s*b) tokens, without recompute."""
    coef = ACT_COEF_DENSE if layer < spec.first_k_dense_replace else ACT_COEF_MOE
    latent = spec.kv_lora_rank + spec.qk_rope_head_dim
    return tokens / (tp * cp) * (coef * spec.hidden_size + BF16 * latent)


def layer_input_bytes(spec: ModelSpec, *, tokens: int, tp: int, cp: int = 1) -> float:
    """[s/TP, b, h] in bf16: what full recompute keeps per checkpointed block."""
    return tokens / (tp * cp) * spec.hidden_size * BF16


# Live [tokens, V] logits at the peak, in fp32 units. log-prob phases: the bf16 logits (0.5), their fp32
# upcast and the log-softmax output (verl logprobs_from_logits). update: the bf16 logits, the fp32
# log-softmax and entropy softmax saved for backward, and the fp32 logits gradient.
LOGITS_COPIES = {"log_prob": 2.5, "update": 3.5}


def loss_bytes(*, tokens: int, vocab: int, shards: int = 1, copies: float = 1) -> float:
    """fp32 logits [b, s, V/shards] (seed 001: the loss term, and the 35 GB logits at V=131072)."""
    return tokens * vocab / shards * FP32 * copies


def stage_activation_bytes(acts: list[float], layer_input: float, recompute: Recompute | None) -> tuple[float, float]:
    """(bytes one micro batch keeps for backward on a stage, peak bytes of re-running one checkpointed unit) for the
    stage's per-layer activations `acts`, as megatron-core core_r0.12.1 `TransformerBlock._checkpointed_forward`
    runs the plan's recompute (harness.config.plans.Recompute): `uniform` keeps one input per chunk of num_layers
    layers and re-runs a whole chunk; `block` checkpoints the first num_layers layers one by one."""
    if recompute is None:
        return sum(acts), 0.0
    n = recompute.num_layers
    if recompute.method == "uniform":
        chunks = [acts[i:i + n] for i in range(0, len(acts), n)]
        return len(chunks) * layer_input, max(sum(c) for c in chunks)
    checkpointed = acts[:n]
    return len(checkpointed) * layer_input + sum(acts[n:]), max(checkpointed)


def model_activation_bytes(spec: ModelSpec, *, tokens: int, tp: int, full_recompute: bool,
                           vocab: int | None = None) -> float:
    """Seed 001's total activation of one micro batch through all layers plus the (vocab-parallel) loss,
    which it equates with the first pipeline stage's activation under 1F1B."""
    loss = loss_bytes(tokens=tokens, vocab=vocab or spec.vocab_size, shards=tp)
    if full_recompute:
        return layer_input_bytes(spec, tokens=tokens, tp=tp) + loss
    return sum(layer_activation_bytes(spec, i, tokens=tokens, tp=tp) for i in range(spec.num_hidden_layers)) + loss


# ------------------------------------------------------------------ MLA prefill (vLLM rollout)
# The eager chain per score element: bf16 scores, their fp32 copy for softmax(dtype=float32), the
# fp32 probabilities (the bf16 cast follows once the copy is freed) -> 10 bytes live at the peak.
SCORE_BYTES_PEAK = BF16 + FP32 + FP32


def prefill_activation_bytes(spec: ModelSpec, *, batch: int, seq: int, tp: int, chunk: int | None) -> float:
    """Peak transient memory of one MLA prefill (one layer) on a device with heads/tp heads.

    vanilla (chunk None): the [b, h, s, s] score chain plus the materialized [b, 1, s, s] bf16 mask;
    chunked: the same chain over [b, h, chunk, s]. Plus the per-token projections (q, k, v, the
    kv_b expansion and the attention output), which the tracer shows are a few percent.
    """
    heads = spec.num_attention_heads // tp
    queries = seq if chunk is None else min(chunk, seq)
    scores = batch * heads * queries * seq * SCORE_BYTES_PEAK
    mask = batch * seq * seq * BF16 if chunk is None else 0
    per_token = heads * (2 * spec.qk_head_dim + (spec.qk_nope_head_dim + spec.v_head_dim) + 2 * spec.v_head_dim)
    return scores + mask + batch * seq * per_token * BF16


# ------------------------------------------------------------------ HCCL
def hccl_communicators(scale: Scale) -> int:
    """Communicators of size > 1 a device joins: Megatron's TP/PP/EP/ETP/CP/DP/expert-DP groups and
    vLLM's TP/DP/EP groups. Each allocates HCCL_BUFFSIZE in and out once used, and never frees it
    (seed 001: 6-8 GB of HCCL memory under every phase)."""
    t, r, w = scale.plan.train, scale.plan.rollout, scale.devices
    sizes = (t.tp, t.pp, t.ep, t.etp, t.cp, t.dp(w), w // (t.pp * t.ep * t.etp), r.tp, r.dp, r.ep)
    return sum(1 for s in sizes if s > 1)


def hccl_bytes(scale: Scale, buffsize_mb: int) -> float:
    return hccl_communicators(scale) * 2 * buffsize_mb * MiB


# ------------------------------------------------------------------ phases
def budget_bytes(scale: Scale) -> int:
    """Device memory of the scale's hardware; a CPU scale's device is this host's RAM."""
    if scale.hardware.device_memory_bytes:
        return scale.hardware.device_memory_bytes
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _phase(scale: Scale, phase: str, stage, components: dict[str, float], notes=()) -> PhaseMemory:
    return PhaseMemory(scale.name, phase, stage, {k: v / GiB for k, v in components.items()},
                       round(budget_bytes(scale) / GiB, 2), scale.targets.memory_headroom_gib, tuple(notes))


def prefill_shape(scale: Scale, o: MemoryOptions) -> tuple[int, int, int | None]:
    """(prompts prefilled together on one device, prompt length, query chunk or None for vanilla).

    Chunked prefill bounds a step to max_num_batched_tokens tokens. Without it the scheduler admits
    every waiting prompt up to max_num_seqs and the vanilla MLA prefill pads them into one
    [b, h, s, s] batch (seed 001, GBS 128)."""
    seq = scale.batch.max_prompt_length
    per_rank = max(1, scale.batch.sequences // (scale.devices // scale.plan.rollout.tp))
    if o.chunked_prefill:
        return min(per_rank, max(1, o.max_num_batched_tokens // seq)), seq, min(o.prefill_chunk, seq)
    return min(o.max_num_seqs, per_rank), seq, None


def rollout_phases(scale: Scale, o: MemoryOptions) -> list[PhaseMemory]:
    spec, r, b = scale.model, scale.plan.rollout, scale.batch
    mem = budget_bytes(scale)
    weights, hccl = rollout_weight_bytes(scale), hccl_bytes(scale, o.hccl_buffsize_mb)
    prompts, seq, chunk = prefill_shape(scale, o)
    per_rank = max(1, b.sequences // (scale.devices // r.tp))
    # vLLM sizes the KV pool after profiling one step of max_num_batched_tokens tokens.
    step_prompts = min(per_rank, max(1, o.max_num_batched_tokens // seq))
    profiled = prefill_activation_bytes(spec, batch=step_prompts, seq=seq, tp=r.tp, chunk=chunk)
    # Training state that is not offloaded stays under vLLM (worst stage), and vLLM counts it as used.
    actor = max((actor_state_bytes(scale, i, "rollout", o) for i in range(scale.plan.train.pp)),
                key=lambda c: sum(c.values()))
    kv_pool = (float(o.kv_cache_memory_bytes) if o.kv_cache_memory_bytes is not None else
               max(0.0, o.gpu_memory_utilization * mem - weights - hccl - sum(actor.values()) - profiled))
    prefill = prefill_activation_bytes(spec, batch=prompts, seq=seq, tp=r.tp, chunk=chunk)
    how = (f"chunked MLA prefill: {prompts} prompts x {seq} tokens per step, query chunk {chunk}" if chunk else
           f"vanilla MLA prefill: {prompts} prompts x {seq} tokens at once ([b,h,s,s] scores); "
           "fix: enable chunked prefill (rollout.enable_chunked_prefill / chunk_prefill_for_mla)")
    latent = spec.kv_lora_rank + spec.qk_rope_head_dim
    kv_need = latent * BF16 * spec.num_hidden_layers * (seq + o.max_response_length)
    # vLLM refuses to start when the pool cannot hold one max_model_len sequence (vllm v1 core/kv_cache_utils.py
    # check_enough_kv_cache_memory: "No available memory for the cache blocks" / "... larger than the maximum number of
    # tokens that can be stored in KV cache"): the rollout fails whatever its peak
    refused = None if kv_pool >= kv_need else (
        f"vLLM cannot start: its KV pool {kv_pool / GiB:.2f} GiB holds no full sequence ({kv_need / GiB:.2f} GiB "
        f"for {seq + o.max_response_length} tokens at gpu_memory_utilization {o.gpu_memory_utilization:g}): raise "
        "gpu_memory_utilization, offload the actor, or lower max_model_len")
    decode = min(o.max_num_seqs, per_rank) * spec.hidden_size * FP32 * 4  # a few [tokens, h] buffers per step
    base = {"weights": weights, "kv_cache": kv_pool, "hccl": hccl, **actor}
    return [replace(_phase(scale, "rollout", None, {**base, "activations": decode}), refused=refused),
            replace(_phase(scale, "prefill", None, {**base, "activations": prefill}, [how]), refused=refused)]


def actor_state_bytes(scale: Scale, stage: int, phase: str, o: MemoryOptions) -> dict[str, float]:
    """Training state resident on a device of `stage` during `phase` (verl megatron offload semantics):
    a phase loads what it uses (the actor's params for old_log_prob and update, the reference model's
    for ref_log_prob, grads for update); what is not offloaded stays resident in every phase."""
    t, w = scale.plan.train, scale.devices
    dense, experts = train_params(scale, stage)
    params = dense + experts
    dp, expert_dp = t.dp(w), max(1, w // (t.pp * t.ep * t.etp))
    c = {}
    if phase in ("old_log_prob", "update") or not o.param_offload:
        c["params"] = params * BF16
    if phase == "ref_log_prob":
        c["ref_params"] = params * BF16
    if phase == "update" or not o.grad_offload:
        c["grads"] = params * o.grad_bytes
    if not o.optimizer_offload:
        c["optimizer"] = (dense / dp + experts / expert_dp) * o.optimizer_bytes
    return c


def host_offload_bytes(scale: Scale, options: MemoryOptions) -> float:
    """Host memory one device's offloads take at most (the worst pipeline stage): what `actor_state_bytes` keeps
    off the device -- bf16 params, grads, the distributed optimizer's shard -- plus the rollout's weights where
    verl's sleep level offloads them to the host (level 1: harness.config.platforms, vLLM sleep mode). What a pod
    of the K8s manifest requests per device, for the offloads its job sets (`options`, from the job)."""
    o = options.resolve(scale)
    t, w = scale.plan.train, scale.devices
    dp, expert_dp = t.dp(w), max(1, w // (t.pp * t.ep * t.etp))
    worst = 0.0
    for stage in range(len(stage_layers(scale))):
        dense, experts = train_params(scale, stage)
        params = dense + experts
        host = (params * BF16 * o.param_offload + params * o.grad_bytes * o.grad_offload
                + (dense / dp + experts / expert_dp) * o.optimizer_bytes * o.optimizer_offload)
        worst = max(worst, host)
    if platform_facts(scale.hardware.kind).sleep_level == 1:
        worst += rollout_weight_bytes(scale)
    return worst


def train_phase(scale: Scale, phase: str, o: MemoryOptions) -> PhaseMemory:
    """The worst pipeline stage of a training-side phase (old_log_prob, ref_log_prob, update)."""
    spec, t = scale.model, scale.plan.train
    w = scale.devices
    seq = scale.batch.max_prompt_length + o.max_response_length
    micro = {"old_log_prob": o.log_prob_micro_batch, "ref_log_prob": o.ref_micro_batch}.get(phase, o.micro_batch)
    tokens = micro * seq
    dp = t.dp(w)
    vocab = vocab_padded(spec, t.tp)
    mini = scale.batch.mini_batch
    microbatches = max(1, mini * scale.batch.n // (dp * o.micro_batch))
    hccl = hccl_bytes(scale, o.hccl_buffsize_mb)
    best = None
    for stage, layers in enumerate(stage_layers(scale)):
        c = actor_state_bytes(scale, stage, phase, o)
        if phase == "update":
            in_flight = min(t.pp - stage, microbatches)  # 1F1B warm-up depth
            acts = [layer_activation_bytes(spec, i, tokens=tokens, tp=t.tp, cp=t.cp) for i in layers]
            kept, recompute = stage_activation_bytes(acts, layer_input_bytes(spec, tokens=tokens, tp=t.tp, cp=t.cp),
                                                     t.recompute)
            c["activations"] = in_flight * kept
            if recompute:
                c["recompute"] = recompute
        else:
            # forward only (no grad): activations die with their layer; one layer's worth (bounded by
            # what it would keep for backward) is live at a time
            c["activations"] = max(layer_activation_bytes(spec, i, tokens=tokens, tp=t.tp, cp=t.cp) for i in layers)
        if stage == t.pp - 1:
            shards = t.tp * t.cp if o.vocab_parallel_logits else t.cp
            copies = LOGITS_COPIES["update" if phase == "update" else "log_prob"]
            c["logits"] = loss_bytes(tokens=tokens, vocab=vocab, shards=shards, copies=copies)
        c["hccl"] = hccl
        cand = _phase(scale, phase, stage, c)
        if best is None or cand.peak_gib > best.peak_gib:
            best = cand
    if "logits" in best.components and best.largest == "logits" and not best.fits:
        best = replace(best, notes=best.notes + (logits_fix(scale, replace(o, micro_batch=micro)),))
    return best


def logits_fix(scale: Scale, o: MemoryOptions) -> str:
    t = scale.plan.train
    return (f"logits [{o.micro_batch}, {scale.batch.max_prompt_length + o.max_response_length}, "
            f"{vocab_padded(scale.model, t.tp)}] fp32 do not fit: enable context parallel "
            f"(actor megatron context_parallel_size, now {t.cp}), lower the micro batch "
            f"(ppo_micro_batch_size_per_gpu / log_prob_micro_batch_size_per_gpu, now {o.micro_batch}) "
            f"or cap the max response length (data.max_response_length, now {o.max_response_length})")


def _check_modelable(scale: Scale) -> None:
    """PlanError when the plan has no shape to model: a parallel size below 1, or pipeline stages that are not
    pp non-empty stages. A plan that breaks an expressibility rule (seed 002's MindSpeed stage list) is still
    modelled as written; one with a zero-layer stage or a zero-way group divided by zero or maxed an empty list."""
    from harness.errors import PlanError

    t, r = scale.plan.train, scale.plan.rollout
    sizes = {"tp": t.tp, "pp": t.pp, "ep": t.ep, "etp": t.etp, "cp": t.cp, "rollout.tp": r.tp, "rollout.dp": r.dp,
             "rollout.ep": r.ep, "devices": scale.devices}
    bad = next((f"{k}={v}" for k, v in sizes.items() if not (isinstance(v, int) and v >= 1)), None)
    if bad is None and t.stage_layers and (len(t.stage_layers) != t.pp or min(t.stage_layers) < 1):
        bad = f"stage layers {list(t.stage_layers)[:16]} for pp={t.pp}"
    if bad is not None:
        raise PlanError(f"{scale.name}: no memory to model for {bad}: every group needs >= 1 device and every "
                        "pipeline stage >= 1 layer")


def plan_memory(scale: Scale, options: MemoryOptions,
                phases: tuple[str, ...] = PHASES) -> list[PhaseMemory]:
    """Per-phase peak memory of `scale` on its worst device under the job's `options`
    (harness.memory.job_options.memory_options); one PhaseMemory per requested phase."""
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise BadInput(f"phase {unknown[0]!r}: use one of {', '.join(PHASES)}")
    check_world(scale)  # one line, not a ZeroDivisionError, for a world smaller than the plan (issue 30)
    _check_modelable(scale)
    o = options.resolve(scale)
    out = []
    if {"rollout", "prefill"} & set(phases):
        out += [p for p in rollout_phases(scale, o) if p.phase in phases]
    out += [train_phase(scale, p, o) for p in phases if p not in ("rollout", "prefill")]
    return out
