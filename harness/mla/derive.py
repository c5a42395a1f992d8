"""MLA closed forms: what every engine's MLA must compute, written once (DeepSeek-V3 equations, vLLM layouts).

- `softmax_scale`: (qk_nope + qk_rope)^-0.5 * mscale^2 -- MindSpeed used 1/sqrt(128) (seed 001 精度问题2).
- `derive_absorbed`: W_UK_T / W_UV as views of kv_b_proj.weight, as upstream vLLM derives them -- vllm-ascend's
  `.contiguous()` copies went stale after every weight sync (seed 001 精度问题1, verl PR #4130 / #5235).

Layouts follow vLLM's `MLAAttention.process_weights_after_loading`: kv_b_proj.weight is [N*(P+V), L];
W_UK_T is [N, P, L]; W_UV is [N, L, V] (N heads, P qk_nope, V v_head, L kv_lora_rank).
"""
from __future__ import annotations

import torch

from harness.config.models import ModelSpec, yarn_mscale


# ---------------------------------------------------------------- softmax scale
def softmax_scale(spec: ModelSpec) -> float:
    """The MLA softmax scale: (qk_nope + qk_rope)^-0.5 * mscale^2 (yarn) — 0.1352338 for DSV3, 192^-0.5 for
    Moonlight. DeepSeek's yarn scales the scores by mscale(factor, mscale_all_dim)^2 (HF `yarn_apply_mscale`,
    vLLM `DeepseekV2MLAAttention`)."""
    scale = spec.qk_head_dim ** -0.5
    rope = spec.rope_scaling
    if rope is not None and rope.mscale_all_dim:
        m = yarn_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return scale


def wrong_scales(spec: ModelSpec) -> dict[str, float]:
    """The scales real bugs used, by the dimension they took: MindSpeed v2.2.0_core_r0.12.1's flash-attention
    adaptor passes 1/sqrt(kv_channels) (Megatron-LM core_v0.12.1 `DotProductAttention.__init__`:
    hidden_size_per_attention_head = kv_channels) -- kv_channels = v_head_dim = 128 in seed 001's setup (0.0884 for
    DSV3), and kv_channels = qk_rope_head_dim = 64 where mbridge takes it from the HF config's head_dim (mbridge
    core/llm_bridge.py `"kv_channels": ("head_dim", None)`; transformers' DeepseekV3Config sets head_dim =
    qk_rope_head_dim: 0.125); and the yarn scale without mscale^2."""
    return {"v_head_dim": spec.v_head_dim ** -0.5, "qk_rope_head_dim": spec.qk_rope_head_dim ** -0.5,
            "no_mscale": spec.qk_head_dim ** -0.5}


# ---------------------------------------------------------------- absorbed weights
def derive_absorbed(kv_b_weight: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_UK_T [N,P,L], W_UV [N,L,V]) as VIEWS of kv_b_proj.weight [N*(P+V), L], exactly as upstream vLLM's
    `split_kv_b_proj` + `process_weights_after_loading` (`.T.view(L, N, P+V).split`, no copy)."""
    n, p, v, lat = spec.num_attention_heads, spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
    if tuple(kv_b_weight.shape) != (n * (p + v), lat):
        raise ValueError(f"kv_b_proj weight {tuple(kv_b_weight.shape)} does not match {spec.name}: "
                         f"expected {(n * (p + v), lat)}")
    w_uk, w_uv = kv_b_weight.T.view(lat, n, p + v).split([p, v], dim=-1)
    return w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)


def misderive_absorbed(kv_b_weight: torch.Tensor, spec: ModelSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Wrong layouts of `derive_absorbed` that real code can produce (the freshness diagnosis matches a mismatch
    against them): "v_first" splits each head's rows [v | nope] instead of [nope | v]; "heads_inner" reads the
    rows as [(P+V), N] instead of [N, (P+V)]. Same shapes as the right derivation, so only values tell."""
    n, p, v, lat = spec.num_attention_heads, spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
    derive_absorbed(kv_b_weight, spec)  # validates the shape
    w_v, w_k = kv_b_weight.T.view(lat, n, p + v).split([v, p], dim=-1)
    out = {"v_first": (w_k.permute(1, 2, 0), w_v.transpose(0, 1))}
    w_k2, w_v2 = kv_b_weight.T.view(lat, p + v, n).transpose(1, 2).split([p, v], dim=-1)
    out["heads_inner"] = (w_k2.permute(1, 2, 0), w_v2.transpose(0, 1))
    return out
