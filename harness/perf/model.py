"""Phase model of one DAPO step: seconds per phase and TPS/card predicted from a plan (a Scale: the registry's, or a
user recipe's as `harness.config.job` builds it), before 128 cards are booked.

Physics per phase (every constant below names its source; CALIBRATION is the one fit):
  gen (rollout)   prefill: compute-bound forward of the prompts; decode: bound by HBM bandwidth -- every decode
                  step reads the device's rollout weights (harness.memory.phases.rollout_weight_bytes) and the live
                  sequences' MLA latent KV cache -- with the KV pool (harness.memory) deciding how many sequences
                  decode at once; plus the per-step DP synchronisation on the host (gloo all-reduces).
  old_log_prob,   forward (ref, old_log_prob) and forward + backward + recomputed forward (update) FLOPs over
  ref, update     the devices at an MFU per phase, times the slowest pipeline stage's share and the pipeline
                  bubble, plus Ray's serial task dispatch of the batch (removed by a device-side tensor cache).
  update_weights  (reshard) per-tensor collective latency over the model's tensors plus the rollout weights over
                  the inter-die link.
  offload         rollout + training weights of a device over the host link.
  reward, adv     host-side per response token / per sequence.
TPS/card = GBS x n x (mean prompt + mean response) / (step seconds x cards), verl's count (harness.metrics.throughput).

Calibration: seed 002's published A3 breakdown (hicann/cann-recipes-train docs/llm_rl/deepseek_rl_train_optimization.md
§1.4.1, real weights, recompute 4 layers: step 859.68 s = gen 373.65 + ref 144.5 + reward 5.0 + adv 0.21 + update
319.3 + reshard 11.5 + offload 5.5; 123.16 TPS/card). One run fixes one number per phase, so each phase has exactly
one calibrated constant (CALIBRATION), everything else is a datasheet figure or a measurement the same document
reports. What that means for trust outside it: `TRUST` (and `plan` prints it).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from harness.config.roofline import attention_flops_per_forward, matmul_params
from harness.config.scales import Scale
from harness.errors import BadInput

GB = 1e9

# ---------------------------------------------------------------- datasheet figures (per torch device: a die on A3)
# HBM bandwidth, bytes/s per device. A3: Ascend 910C package 3.2 TB/s over its two dies (Huawei/SiliconFlow,
# "Serving Large Language Models on Huawei CloudMatrix384", arXiv:2506.12708, the 910C's HBM figure); A2: Ascend 910B
# ~1.6 TB/s (vendor material; not confirmed from a Huawei datasheet here, so A2 predictions carry that doubt too);
# H100 SXM 3.35 TB/s, H200 SXM 4.8 TB/s (NVIDIA datasheets).
HBM_BYTES_PER_S = {"a3": 1.6e12, "a2": 1.6e12, "h100": 3.35e12, "h200": 4.8e12}
HBM_SOURCE = {"a3": "910C 3.2 TB/s per package / 2 dies (arXiv:2506.12708)", "a2": "910B ~1.6 TB/s (vendor material)",
              "h100": "NVIDIA H100 SXM datasheet 3.35 TB/s", "h200": "NVIDIA H200 SXM datasheet 4.8 TB/s"}
# Inter-die link for the reshard's bytes: A3 unified bus 392 GB/s unidirectional per 910C (arXiv:2506.12708), per
# die half; A2 HCCS is assumed the same (unsourced; the reshard is latency-bound, the bytes term is <2 % of it);
# NVLink 4 450 GB/s per direction (NVIDIA H100/H200 datasheets).
LINK_BYTES_PER_S = {"a3": 196e9, "a2": 196e9, "h100": 450e9, "h200": 450e9}
BF16 = 2

# ---------------------------------------------------------------- measurements the same document reports (not fit)
# §6.6.1: two gloo CPU all-reduces per decode step across the DP domain (has_unfinished_requests,
# _get_forward_metadata_across_dp), ~10 ms each on A3 128 cards; §6.6.3: on HCCL each falls under 3 ms.
DP_SYNC_S_PER_DECODE_STEP = {"gloo": 2 * 10e-3, "hccl": 2 * 3e-3}
# §3.2.4: Ray's serial task dispatch before the TensorCache: ref ~57 s, update ~73 s, measured at 0.075K prompt /
# 3K response x 8192 sequences (25.5 M tokens); dispatch serialises the batch, so it scales with its tokens.
DISPATCH_TOKENS = 8192 * (75 + 3000)
DISPATCH_S_PER_TOKEN = {"ref": 57.0 / DISPATCH_TOKENS, "old_log_prob": 57.0 / DISPATCH_TOKENS,
                        "update_actor": 73.0 / DISPATCH_TOKENS}
# §6.1.3: TorchAir graph mode "doubles decode throughput on the full 671B network" (eager decode is launch-bound:
# the host issues every op); the calibration run is in graph mode, an eager plan decodes this much slower.
EAGER_DECODE_SLOWDOWN = 2.0
# ... and with the TensorCache (D2D): ref < 1 s, update ~5 s left.
DISPATCH_S_TENSOR_CACHE = {"ref": 1.0, "old_log_prob": 1.0, "update_actor": 5.0}


@dataclass(frozen=True)
class Calibration:
    """The constants fit to seed 002's breakdown, one per phase (see the module docstring); each derived by
    inverting that phase's formula at the calibration plan (`calibration_case`, tests/test_perf_model.py re-derives
    them). A constant here is not a physical efficiency alone: it absorbs what the formula leaves out (named)."""

    # gen: achieved share of HBM bandwidth in decode. Absorbs MoE dispatch/combine (MC2) latency, the decode pre/
    # post-processing and expert imbalance of real weights (§6.6.1: pure model time is < 60 % of the 373 s).
    decode_hbm_efficiency: float = 0.190
    # ref (and prefill, old_log_prob: forwards too): MFU of the forward after the dispatch is taken off.
    forward_mfu: float = 0.101
    # update: MFU of forward + backward + recompute.
    update_mfu: float = 0.145
    # reward: host seconds per response token (rule-based math reward, verl's reward manager).
    reward_s_per_response_token: float = 5.0 / (8192 * 1576.6)
    # adv: host seconds per sequence (GRPO group normalisation).
    adv_s_per_sequence: float = 0.21 / 8192
    # update_weights: seconds per weight tensor (one collective each; MLA + MoE layers hold ~16 tensors).
    reshard_s_per_tensor: float = 0.0111
    # offload: effective host-link bytes/s per device (onload/offload of rollout and training weights, cache init).
    offload_bytes_per_s: float = 9.46e9


CALIBRATION = Calibration()

TRUST = ("calibrated on one run (seed 002: A3 128 cards, DSV3 671B, 1k/3k, real weights, recompute 4): there every "
         "phase is exact by construction; a knob whose physics the model carries moves it reliably (recompute 8 "
         "layers, not calibrated on: 118.1 TPS/card predicted vs 112 published at first, +5 %, and 120+ later, -2 %); "
         "what a calibrated constant absorbs does not transfer: on the published random-weight run (forced expert "
         "balance, every optimisation, 3k responses) gen +4 % and reshard +3 % hold, but ref +116 %, update +69 %, "
         "reward -30 %, offload -80 %, TPS/card -30 %. Treat another chip, another model or another expert balance "
         "as a 2x band, and recalibrate on its first run. gen is calibrated on decode under TorchAir graph mode "
         "(hicann/cann-recipes-train docs/llm_rl/deepseek_rl_train_optimization.md §2.2, §6.1), which the supported "
         "stacks no longer have (vllm-ascend PR #4814, first tag v0.12.0rc1, removed it; ACL graph only, up to ~10x "
         "slower on A2: vllm-ascend #4984): a gen prediction under ACL graph is uncalibrated until the first nightly "
         "on the stack measures it")

# verl 0.9.1 timing_s/<key> of each phase (ray_trainer.py `marked_timer` names); offload has no key of its own.
VERL_KEYS = {"gen": "gen", "old_log_prob": "old_log_prob", "ref": "ref", "reward": "reward", "adv": "adv",
             "update_actor": "update_actor", "update_weights": "update_weights", "offload": None}
PHASES = tuple(VERL_KEYS)


@dataclass(frozen=True)
class Workload:
    """What a plan does not say: the mean lengths the data set produces and how many decode steps the longest
    response takes. Default (`default_workload`): seed 002's deepscaler shape."""

    mean_prompt: float
    mean_response: float
    decode_steps: int
    source: str = "given"

    @property
    def mean_tokens(self) -> float:
        return self.mean_prompt + self.mean_response


# Seed 002 (deepscaler, max 1024/3072): mean prompt 77.8, mean response 1576.6 = 51.3 % of the maximum.
SEED002_PROMPT, SEED002_RESPONSE, SEED002_MAX_RESPONSE = 77.8, 1576.6, 3072


def default_workload(scale: Scale, mean_response: float | None = None) -> Workload:
    """Seed 002's workload shape on the scale's lengths: prompt 77.8 tokens (at most the max), response 51.3 % of the
    max; the longest of thousands of responses reaches the max, so decode runs max_response_length steps."""
    b = scale.batch
    response = mean_response if mean_response is not None else \
        b.max_response_length * SEED002_RESPONSE / SEED002_MAX_RESPONSE
    return Workload(mean_prompt=min(SEED002_PROMPT, b.max_prompt_length), mean_response=response,
                    decode_steps=b.max_response_length,
                    source="seed 002's deepscaler shape (prompt 77.8, response 51.3 % of the max)")


@dataclass(frozen=True)
class Features:
    """Software the run has that the plan does not record (seed 002's patches): verl 0.9.1 stock is the default."""

    # §5.2: old_log_prob = log_prob.detach() (seed 002's verl patch); verl 0.9.1 computes it unless bypass mode
    skip_old_log_prob: bool = False
    tensor_cache: bool = False  # §3.2: device-side TensorCache, no Ray serial dispatch
    dp_sync: str = "gloo"  # §6.6: the decode step's DP all-reduces on gloo (stock) or HCCL
    # The physics of decode: "memory" (the model). "compute" exists for the self-test that a wrong bound fails.
    decode_bound: str = "memory"


# verl 0.9.1 trainer/ppo/ray_trainer.py `RayPPOTrainer.fit`: with algorithm.rollout_correction.bypass_mode the
# rollout's log-probs stand in for old_log_prob and its forward is not run (seed 002's log_prob.detach() patch, §5.2,
# reaches the same end); otherwise `_compute_old_log_prob` runs under the "old_log_prob" timer.
BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"


def features_from_overrides(overrides, base: Features | None = None) -> Features:
    """The Features a verl command line implies: old_log_prob skipped where it sets bypass mode true."""
    base = base or Features()
    for override in overrides:
        key, _, value = str(override).lstrip("+").partition("=")
        if key == BYPASS_KEY:
            base = dataclasses.replace(base, skip_old_log_prob=value.strip().lower() in ("true", "1", "yes"))
    return base


@dataclass(frozen=True)
class PhaseTime:
    name: str
    seconds: float
    verl_key: str | None
    how: str  # the formula with its numbers, one line

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Prediction:
    scale: str
    hardware: str
    cards: int
    workload: Workload
    features: Features
    phases: tuple[PhaseTime, ...]
    detail: dict  # gen's parts (prefill, decode, host sync), waves, bytes per decode step

    @property
    def step_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def tokens(self) -> float:
        return self.detail["sequences"] * self.workload.mean_tokens

    @property
    def tps_per_card(self) -> float:
        return self.tokens / (self.step_s * self.cards)

    def phase(self, name: str) -> float:
        return next(p.seconds for p in self.phases if p.name == name)

    def to_json(self) -> dict:
        return {"scale": self.scale, "hardware": self.hardware, "cards": self.cards, "step_s": self.step_s,
                "tps_per_card": self.tps_per_card, "tokens_per_step": self.tokens,
                "workload": dataclasses.asdict(self.workload), "features": dataclasses.asdict(self.features),
                "phases": [p.to_json() for p in self.phases], "detail": self.detail, "trust": TRUST}


def recompute_fraction(scale: Scale) -> float:
    """Share of the layers Megatron's full recompute re-runs in backward: `block` checkpoints the first num_layers
    of each stage, `uniform` every layer (harness.config.plans.Recompute)."""
    t = scale.plan.train
    if t.recompute is None:
        return 0.0
    layers = scale.model.num_hidden_layers
    counts = t.stage_layers or (layers // t.pp,) * t.pp
    if t.recompute.method == "uniform":
        return 1.0
    return sum(min(t.recompute.num_layers, c) for c in counts) / layers


def pipeline_factor(scale: Scale, sequences_per_dp: float, micro_batch: int) -> float:
    """Slowest stage over the mean stage, times the 1F1B bubble (1 + (pp - 1) / micro-batches)."""
    t = scale.plan.train
    layers = scale.model.num_hidden_layers
    counts = t.stage_layers or (layers // t.pp,) * t.pp
    imbalance = max(counts) * t.pp / layers
    micro_batches = max(1.0, sequences_per_dp / micro_batch)
    return imbalance * (1 + (t.pp - 1) / micro_batches)


def weight_tensors(scale: Scale) -> int:
    """Tensors the reshard sends, one collective each (HF names, what vLLM's load_weights receives): per MLA layer
    q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o and the two layer norms (7 without q_lora); a dense MLP's gate, up,
    down; a MoE layer's router weight and bias, shared expert gate/up/down and the grouped routed experts' three
    (seed 002 §4.1.1 sends experts per layer by AlltoAllV); embedding, final norm, lm_head."""
    spec = scale.model
    attn = 9 if spec.q_lora_rank else 7
    return spec.num_dense_layers * (attn + 3) + spec.num_moe_layers * (attn + 8) + 3


def _kv_pool_sequences(scale: Scale, per_rank: int, mean_tokens: float, options) -> tuple[int, float]:
    """(sequences one rollout DP rank decodes at once, KV pool GiB): the memory model's KV pool under the job's
    memory `options` over the latent cache of a mean sequence (vLLM's paged KV holds the tokens a sequence has, not
    its maximum), at most the rank's sequences and vLLM's max_num_seqs."""
    from harness.memory.phases import GiB, plan_memory

    options = options.resolve(scale)
    rollout = plan_memory(scale, options, phases=("rollout",))[0]
    pool_gib = rollout.components.get("kv_cache", 0.0)
    spec = scale.model
    per_seq = (spec.kv_lora_rank + spec.qk_rope_head_dim) * BF16 * spec.num_hidden_layers * mean_tokens
    fit = int(pool_gib * GiB // per_seq)
    return max(1, min(per_rank, fit, options.max_num_seqs)), pool_gib


def predict(scale: Scale, workload: Workload | None = None, features: Features | None = None,
            calibration: Calibration = CALIBRATION, memory=None) -> Prediction:
    """The phase times and TPS/card of one step of `scale`. BadInput when the hardware has no datasheet figures
    (CPU: its runs are functional, not performance). `memory`: the job's MemoryOptions (harness.memory.job_options:
    its offloads and vLLM pool settings size the KV pool); None: those of the scale's own job, as `plan` emits it."""
    hw = scale.hardware.name
    if hw not in HBM_BYTES_PER_S or scale.hardware.peak_bf16_tflops <= 0:
        raise BadInput(f"--scale {scale.name}: no phase model for hardware {hw!r} (no datasheet bandwidth/peak; "
                       f"modelled: {', '.join(HBM_BYTES_PER_S)})")
    w = workload or default_workload(scale)
    f = features or Features()
    c = calibration
    if f.dp_sync not in DP_SYNC_S_PER_DECODE_STEP or f.decode_bound not in ("memory", "compute"):
        raise BadInput(f"perf features: dp_sync {f.dp_sync!r} / decode_bound {f.decode_bound!r} unknown")
    spec, plan, batch = scale.model, scale.plan, scale.batch
    devices = scale.devices
    peak = scale.hardware.peak_bf16_tflops * 1e12  # per device
    sequences = batch.sequences
    tokens = sequences * w.mean_tokens
    forward_flops = 2 * matmul_params(spec) + attention_flops_per_forward(spec, w.mean_tokens)
    prompt_flops = 2 * matmul_params(spec) + attention_flops_per_forward(spec, w.mean_prompt)

    # ---- gen
    r = plan.rollout
    dp_ranks = devices // r.tp
    per_rank = math.ceil(sequences / dp_ranks)
    if memory is None:
        from harness.config.job import build_job
        from harness.memory.job_options import memory_options

        memory = memory_options(build_job(scale)).options
    concurrent, pool_gib = _kv_pool_sequences(scale, per_rank, w.mean_tokens, memory)
    waves = math.ceil(per_rank / concurrent)
    from harness.memory.phases import rollout_weight_bytes

    weights = rollout_weight_bytes(scale)
    kv_per_token = (spec.kv_lora_rank + spec.qk_rope_head_dim) * BF16 * spec.num_hidden_layers
    # latent KV reads of one sequence over its decode: sum over its R steps of (prompt + t) tokens
    kv_per_sequence = kv_per_token * (w.mean_response * w.mean_prompt + w.mean_response ** 2 / 2)
    steps = waves * w.decode_steps
    decode_bytes = steps * weights + per_rank * kv_per_sequence
    memory_s = decode_bytes / (HBM_BYTES_PER_S[hw] * c.decode_hbm_efficiency)
    # the compute roof of decode at the datasheet peak: a decode step multiplies a few tokens per weight it reads
    compute_s = sequences * w.mean_response * forward_flops / (devices * peak)
    decode_s = max(memory_s, compute_s) if f.decode_bound == "memory" else compute_s
    if not scale.graph_mode:
        decode_s *= EAGER_DECODE_SLOWDOWN
    prefill_s = sequences * w.mean_prompt * prompt_flops / (devices * peak * c.forward_mfu)
    sync_s = steps * DP_SYNC_S_PER_DECODE_STEP[f.dp_sync]
    gen = prefill_s + decode_s + sync_s

    # ---- forward/backward phases
    t = plan.train
    train_dp = t.dp(devices)
    pipe = pipeline_factor(scale, sequences / train_dp, batch.micro_batch_size_per_device)
    rc = recompute_fraction(scale)

    def dispatch(phase: str) -> float:
        return DISPATCH_S_TENSOR_CACHE[phase] if f.tensor_cache else tokens * DISPATCH_S_PER_TOKEN[phase]

    fwd_s = tokens * forward_flops * pipe / (devices * peak * c.forward_mfu)
    ref = fwd_s + dispatch("ref")
    old = 0.0 if f.skip_old_log_prob else fwd_s + dispatch("old_log_prob")
    update_flops = (3 + rc) * forward_flops
    update_compute = tokens * update_flops * pipe / (devices * peak * c.update_mfu)
    update = update_compute + dispatch("update_actor")

    # ---- switch and host phases
    tensors = weight_tensors(scale)
    reshard = tensors * c.reshard_s_per_tensor + weights / LINK_BYTES_PER_S[hw]
    from harness.memory.phases import stage_layers, train_params

    train_bytes = max(sum(train_params(scale, i)) for i in range(len(stage_layers(scale)))) * BF16
    offload = (weights + train_bytes) / c.offload_bytes_per_s
    reward = sequences * w.mean_response * c.reward_s_per_response_token
    adv = sequences * c.adv_s_per_sequence

    tf = f"{devices} x {peak / 1e12:g} TFLOPS"
    eager = "" if scale.graph_mode else f", eager x{EAGER_DECODE_SLOWDOWN:g}"
    phases = (
        PhaseTime("gen", gen, "gen", f"prefill {prefill_s:.1f} s + decode {decode_s:.1f} s ({steps} steps x "
                  f"{weights / GB:.1f} GB weights + KV, HBM {HBM_BYTES_PER_S[hw] / 1e12:g} TB/s x "
                  f"{c.decode_hbm_efficiency:g}{eager}) + DP sync {sync_s:.1f} s ({f.dp_sync})"),
        PhaseTime("old_log_prob", old, "old_log_prob", "skipped (log_prob.detach())" if f.skip_old_log_prob else
                  f"forward {fwd_s:.1f} s + dispatch {dispatch('old_log_prob'):.1f} s"),
        PhaseTime("ref", ref, "ref", f"forward {tokens / 1e6:.2f} M tokens x {forward_flops / 1e9:.0f} GFLOP / "
                  f"({tf} x MFU {c.forward_mfu:g}) x pipeline {pipe:.3f} = {fwd_s:.1f} s + dispatch "
                  f"{dispatch('ref'):.1f} s"),
        PhaseTime("reward", reward, "reward", f"{sequences} x {w.mean_response:.0f} response tokens on the host"),
        PhaseTime("adv", adv, "adv", f"{sequences} sequences on the host"),
        PhaseTime("update_actor", update, "update_actor", f"(3 + recompute {rc:.2f}) forwards at MFU {c.update_mfu:g} "
                  f"x pipeline {pipe:.3f} = {update_compute:.1f} s + dispatch {dispatch('update_actor'):.1f} s"),
        PhaseTime("update_weights", reshard, "update_weights",
                  f"{tensors} tensors x {c.reshard_s_per_tensor * 1e3:.1f} ms + {weights / GB:.1f} GB over the link"),
        PhaseTime("offload", offload, None, f"{(weights + train_bytes) / GB:.1f} GB per device over the host link at "
                  f"{c.offload_bytes_per_s / 1e9:g} GB/s"),
    )
    detail = {"sequences": sequences, "prefill_s": prefill_s, "decode_s": decode_s, "decode_memory_s": memory_s,
              "decode_compute_s": compute_s, "dp_sync_s": sync_s, "decode_steps": steps, "waves": waves,
              "sequences_per_rollout_rank": per_rank, "concurrent_sequences": concurrent, "kv_pool_gib": pool_gib,
              "rollout_weight_gb_per_device": weights / GB, "recompute_fraction": rc, "pipeline_factor": pipe,
              "graph_mode": scale.graph_mode, "hbm_source": HBM_SOURCE[hw]}
    return Prediction(scale=scale.name, hardware=hw, cards=scale.cards, workload=w, features=f, phases=phases,
                      detail=detail)
