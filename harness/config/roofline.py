"""Compute-bound roofline of the RL step: the TPS/card no run of a scale can beat at the hardware's peak.

FLOPs per token (prompt or response token; the 2N-per-token rule of Kaplan et al. / Megatron's MFU):
  rollout (prefill + decode)                2 N      one forward in vLLM
  old log-prob (actor, no grad)             2 N      verl compute_log_prob
  ref log-prob                              2 N      the KL reference
  update                                    6 N      forward + backward (2 + 4)
  recompute                                 2 N r    recomputed layers run the forward again
with N the matmul parameters a token touches (active MoE experts; the input embedding is a lookup, so
it does not count; the lm_head does) and r the recomputed share of layers (seed 002: 8 recompute
layers with 7-8 layers per PP stage, r = 1). Attention scores add, per forward and layer,
2 x heads x (qk_head_dim + v_head_dim) x context, context being the mean causal context of a token
(half the mean sequence length).

Rollout decode is memory-bound in practice, so this is a loose upper bound: it tells a reader how far
from the hardware's limit a run sits (seed 002's 120 TPS/card on A3 is ~9% of it), not what to expect.
Peak figures and their sources live in `harness.config.hardware.PROFILES` (per device; x dies per card). Checked
for this module: A3 376 TFLOPS BF16 dense per die = 752 per Ascend 910C package (Huawei/SiliconFlow,
"Serving Large Language Models on Huawei CloudMatrix384", arXiv:2506.12708; 384 chips ~ 300 PFLOPS);
A2 313 TFLOPS FP16/BF16 per Ascend 910B (Atlas 800T A2 datasheet; the first Ascend 910 was 256);
H100/H200 SXM 989 TFLOPS BF16 dense (NVIDIA datasheets; 1979 is with sparsity).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.config.models import ModelSpec
from harness.config.scales import Scale

# Seed 002 (A3): recompute 8 layers per PP stage with 7-8 layers per stage -> every layer recomputed.
DEFAULT_RECOMPUTE_FRACTION = 1.0
FORWARD_PASSES = {"rollout": 1, "old_log_prob": 1, "ref": 1, "update": 3}  # update = fwd + bwd (2 x fwd)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per token of each phase of one RL step (both prompt and response tokens count)."""

    rollout: float
    old_log_prob: float
    ref: float
    update: float
    recompute: float

    @property
    def total(self) -> float:
        return self.rollout + self.old_log_prob + self.ref + self.update + self.recompute


@dataclass(frozen=True)
class Roofline:
    scale: str
    hardware: str
    matmul_params: int  # active parameters a token multiplies (no input embedding)
    mean_sequence_tokens: float
    recompute_fraction: float
    flops_per_token: StepFlops
    peak_tflops_per_card: float
    peak_source: str
    tps_per_card_limit: float | None  # None where the hardware has no peak (CPU)

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["flops_per_token"]["total"] = self.flops_per_token.total
        return doc

    def fraction(self, measured_tps_per_card: float) -> float | None:
        """Measured TPS/card as a share of the limit (an MFU-like figure)."""
        return measured_tps_per_card / self.tps_per_card_limit if self.tps_per_card_limit else None


def matmul_params(model: ModelSpec) -> int:
    """Active parameters in matmuls: total active minus the input embedding (a gather, no FLOPs)."""
    return model.total_params(active=True) - model.embedding_params()


def attention_flops_per_forward(model: ModelSpec, mean_sequence_tokens: float) -> float:
    """Score + value FLOPs per token and forward: QK^T and AV over the mean causal context (L/2)."""
    context = mean_sequence_tokens / 2
    per_layer = 2 * model.num_attention_heads * (model.qk_head_dim + model.v_head_dim) * context
    return per_layer * model.num_hidden_layers


def step_flops(model: ModelSpec, mean_sequence_tokens: float,
               recompute_fraction: float = DEFAULT_RECOMPUTE_FRACTION) -> StepFlops:
    """FLOPs per token of each RL phase (see the module docstring for the accounting)."""
    forward = 2 * matmul_params(model) + attention_flops_per_forward(model, mean_sequence_tokens)
    f = {phase: passes * forward for phase, passes in FORWARD_PASSES.items()}
    return StepFlops(**f, recompute=recompute_fraction * forward)


def roofline(scale: Scale, mean_sequence_tokens: float | None = None,
             recompute_fraction: float = DEFAULT_RECOMPUTE_FRACTION) -> Roofline:
    """The compute-bound TPS/card limit of `scale`. mean_sequence_tokens: measured prompt + response mean
    when known (the throughput of a run passes it); default: half the scale's maximum sequence."""
    tokens = mean_sequence_tokens if mean_sequence_tokens else scale.batch.max_sequence_length / 2
    flops = step_flops(scale.model, tokens, recompute_fraction)
    hw = scale.hardware
    peak_card = hw.peak_bf16_tflops * hw.dies_per_card
    limit = peak_card * 1e12 / flops.total if peak_card > 0 else None
    return Roofline(scale=scale.name, hardware=hw.name, matmul_params=matmul_params(scale.model),
                    mean_sequence_tokens=tokens, recompute_fraction=recompute_fraction, flops_per_token=flops,
                    peak_tflops_per_card=peak_card, peak_source=hw.peak_source, tps_per_card_limit=limit)
