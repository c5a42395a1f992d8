"""Model registry: DeepSeek-V3 family specs (MLA + MoE) from the official configs down to tiny CPU models.

A `ModelSpec` is the single source of model dimensions for every suite: the memory model, the
fake-tensor tracer, the MLA checks, the DAPO overrides and the tiny models built at test time
(`to_hf_config()` feeds transformers' DeepseekV3 and the vLLM model directory writer).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from harness.config.task import VOCAB as TASK_VOCAB
from harness.errors import BadInput


@dataclass(frozen=True)
class YarnRope:
    """YaRN rope scaling as in DeepSeek-V3's config.json (`rope_scaling`, type yarn)."""

    factor: float
    original_max_position_embeddings: int
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def to_hf(self) -> dict:
        return {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "mscale": self.mscale,
            "mscale_all_dim": self.mscale_all_dim,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
        }


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a DeepSeek-V3-architecture model (names follow the HF config keys)."""

    name: str
    hidden_size: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    intermediate_size: int
    first_k_dense_replace: int
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: YarnRope | None
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    hf_id: str | None = None  # where the official config lives; never downloaded at run time

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def num_moe_layers(self) -> int:
        return max(0, self.num_hidden_layers - self.first_k_dense_replace)

    @property
    def num_dense_layers(self) -> int:
        return min(self.num_hidden_layers, self.first_k_dense_replace)

    def with_layers(self, num_hidden_layers: int, *, first_k_dense_replace: int | None = None,
                    name: str | None = None) -> ModelSpec:
        """Same dimensions, fewer layers (the `reduced` scale)."""
        dense = self.first_k_dense_replace if first_k_dense_replace is None else first_k_dense_replace
        return dataclasses.replace(
            self, num_hidden_layers=num_hidden_layers, first_k_dense_replace=min(dense, num_hidden_layers),
            name=name or f"{self.name}-{num_hidden_layers}l")

    # ---- parameter counts (bf16 weights drive the memory model and the roofline) ----
    def attention_params(self) -> int:
        h, n = self.hidden_size, self.num_attention_heads
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * self.qk_head_dim
        else:
            q = h * n * self.qk_head_dim
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
        o = n * self.v_head_dim * h
        return q + kv_a + kv_b + o

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """One routed (or shared) expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def moe_params(self, *, active: bool = False) -> int:
        routed = self.num_experts_per_tok if active else self.n_routed_experts
        router = self.n_routed_experts * self.hidden_size + self.n_routed_experts  # gate + e_score_correction_bias
        return (routed + self.n_shared_experts) * self.expert_params() + router

    def layer_params(self, layer: int, *, active: bool = False) -> int:
        norms = 2 * self.hidden_size
        mlp = self.dense_mlp_params() if layer < self.first_k_dense_replace else self.moe_params(active=active)
        return self.attention_params() + mlp + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self, *, active: bool = False) -> int:
        layers = sum(self.layer_params(i, active=active) for i in range(self.num_hidden_layers))
        return layers + 2 * self.embedding_params() + self.hidden_size  # embed + lm_head (untied) + final norm

    def to_hf_config(self, **overrides):
        """A transformers `DeepseekV3Config` with these dimensions (imported lazily: transformers is heavy)."""
        from transformers import DeepseekV3Config

        kwargs = dict(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads, q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
            n_routed_experts=self.n_routed_experts, num_experts_per_tok=self.num_experts_per_tok,
            n_shared_experts=self.n_shared_experts, moe_intermediate_size=self.moe_intermediate_size,
            intermediate_size=self.intermediate_size, first_k_dense_replace=self.first_k_dense_replace,
            num_hidden_layers=self.num_hidden_layers, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling.to_hf() if self.rope_scaling else None,
            n_group=self.n_group, topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling_factor,
            rms_norm_eps=self.rms_norm_eps, norm_topk_prob=True, tie_word_embeddings=False,
            architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
        )
        kwargs.update(overrides)
        return DeepseekV3Config(**kwargs)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """DeepSeek's yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 for factor > 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# Official DeepSeek-V3 / R1 config.json values (deepseek-ai/DeepSeek-V3); R1 shares the architecture.
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3", hidden_size=7168, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8,
    n_shared_experts=1, moe_intermediate_size=2048, intermediate_size=18432, first_k_dense_replace=3,
    num_hidden_layers=61, vocab_size=129280, max_position_embeddings=163840, rope_theta=10000.0,
    rope_scaling=YarnRope(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0),
    n_group=8, topk_group=4, routed_scaling_factor=2.5, hf_id="deepseek-ai/DeepSeek-V3",
)

# moonshotai/Moonlight-16B-A3B: MLA without q LoRA and without yarn (softmax scale 192^-0.5).
MOONLIGHT_16B = ModelSpec(
    name="moonlight-16b-a3b", hidden_size=2048, num_attention_heads=16, q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6,
    n_shared_experts=2, moe_intermediate_size=1408, intermediate_size=11264, first_k_dense_replace=1,
    num_hidden_layers=27, vocab_size=163840, max_position_embeddings=8192, rope_theta=50000.0,
    rope_scaling=None, n_group=1, topk_group=1, routed_scaling_factor=2.446, hf_id="moonshotai/Moonlight-16B-A3B",
)

# Tiny DeepSeek-V3 that vLLM's CPU build runs: its MLA kernels need a latent of 576 (kv_lora_rank 512 +
# qk_rope_head_dim 64); everything else is small. qk_nope 64 / v_head 64 with yarn factor 40 make the
# right softmax scale (128^-0.5 * mscale^2 = 0.1657) differ from the MindSpeed bug's 1/sqrt(v_head_dim)
# (0.125) by 33%, close to DSV3's 53%, so a wrong scale is visible in outputs.
TINY = ModelSpec(
    name="tiny-dsv3", hidden_size=256, num_attention_heads=4, q_lora_rank=96, kv_lora_rank=512,
    qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2,
    n_shared_experts=1, moe_intermediate_size=64, intermediate_size=256, first_k_dense_replace=1,
    num_hidden_layers=2, vocab_size=256, max_position_embeddings=4096 * 40, rope_theta=10000.0,
    rope_scaling=YarnRope(factor=40.0, original_max_position_embeddings=4096),
    n_group=1, topk_group=1, routed_scaling_factor=2.5,
)

# TINY over the tiny task's 6-token vocabulary (harness.config.task): the model the tiny scale's DAPO runs train,
# the lab's and verl's alike (the MLA suites keep TINY's 256 tokens: their prompts use ids up to 250).
TINY_TASK = dataclasses.replace(TINY, vocab_size=len(TASK_VOCAB), name="tiny-dsv3-task")

MODELS: dict[str, ModelSpec] = {
    m.name: m for m in (
        DEEPSEEK_V3,
        DEEPSEEK_V3.with_layers(4, name="deepseek-v3-4l"),  # 3 dense + 1 MoE, the `reduced` scale
        MOONLIGHT_16B,
        TINY,
        TINY_TASK,
    )
}


def get_model(name: str) -> ModelSpec:
    """The registered model `name`; BadInput naming the known ones when there is none."""
    try:
        return MODELS[name]
    except KeyError:
        raise BadInput(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
