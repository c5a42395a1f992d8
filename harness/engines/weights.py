"""Tiny DeepSeek-V3 checkpoints built at test time (random weights; nothing is ever downloaded).

`checkpoint_shapes(spec)` lists every tensor of an HF DeepSeek-V3 checkpoint by name;
`random_state_dict(spec, seed)` fills them; `write_model_dir(spec, state_dict, path)` writes the
`config.json` + `model.safetensors` directory that vLLM and transformers load.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from harness.config.models import ModelSpec
from harness.errors import BadInput


def checkpoint_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in an HF DeepSeek-V3 checkpoint with these dimensions."""
    h, n, lat, rope = spec.hidden_size, spec.num_attention_heads, spec.kv_lora_rank, spec.qk_rope_head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if spec.q_lora_rank:
            out[a + "q_a_proj.weight"] = (spec.q_lora_rank, h)
            out[a + "q_a_layernorm.weight"] = (spec.q_lora_rank,)
            out[a + "q_b_proj.weight"] = (n * spec.qk_head_dim, spec.q_lora_rank)
        else:
            out[a + "q_proj.weight"] = (n * spec.qk_head_dim, h)
        out[a + "kv_a_proj_with_mqa.weight"] = (lat + rope, h)
        out[a + "kv_a_layernorm.weight"] = (lat,)
        out[a + "kv_b_proj.weight"] = (n * (spec.qk_nope_head_dim + spec.v_head_dim), lat)
        out[a + "o_proj.weight"] = (h, n * spec.v_head_dim)
        m = p + "mlp."
        if i < spec.first_k_dense_replace:
            mlps = {m: spec.intermediate_size}
        else:
            out[m + "gate.weight"] = (spec.n_routed_experts, h)
            out[m + "gate.e_score_correction_bias"] = (spec.n_routed_experts,)
            mlps = {f"{m}experts.{e}.": spec.moe_intermediate_size for e in range(spec.n_routed_experts)}
            if spec.n_shared_experts:
                mlps[m + "shared_experts."] = spec.moe_intermediate_size * spec.n_shared_experts
        for prefix, inter in mlps.items():
            out[prefix + "gate_proj.weight"] = (inter, h)
            out[prefix + "up_proj.weight"] = (inter, h)
            out[prefix + "down_proj.weight"] = (h, inter)
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (spec.vocab_size, h)
    return out


# Std of the random router bias (e_score_correction_bias): DSV3 adds it to sigmoid scores in (0, 1) for the choice
# of experts only, so 0.1 moves some choices without drowning the gate.
ROUTER_BIAS_STD = 0.1


def random_state_dict(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32, *,
                      zero_router_bias: bool = False, random_norms: bool = False) -> dict[str, torch.Tensor]:
    """Random weights with 1/sqrt(fan_in) scale so every activation is O(1): attention scores then span a
    few units, so a wrong softmax scale or a stale W_UV visibly changes the outputs (HF's 0.02 init would
    leave attention near-uniform and hide both bugs). Norm weights are 1.

    The router bias differs per seed (a bias equal for every seed would hide a weight sync that leaves
    `e_score_correction_bias` behind; it is a buffer in transformers, so a sync of named_parameters() alone
    misses it). It is drawn from its own generator, so every other tensor is the same as with a zero bias;
    `zero_router_bias=True` keeps the zero bias the committed tiny goldens were recorded with. `random_norms=True`:
    norm weights 1 + 0.1 N(0, 1) per seed, from the bias generator (the Megatron sender suite: a norm mapped to the
    wrong module or never sent must change a tensor)."""
    gen = torch.Generator().manual_seed(seed)
    bias_gen = torch.Generator().manual_seed(seed + 0x5EED)
    out = {}
    for name, shape in checkpoint_shapes(spec).items():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=bias_gen) if random_norms else torch.ones(shape)
        elif name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape) if zero_router_bias else ROUTER_BIAS_STD * torch.randn(shape, generator=bias_gen)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen)
        else:
            gain = 2.0 if name == "lm_head.weight" else 1.0  # peaked next-token distributions: stable greedy tokens
            t = torch.randn(shape, generator=gen) * (gain / math.sqrt(shape[-1]))
        out[name] = t.to(dtype)
    return out


def write_model_dir(spec: ModelSpec, state_dict: dict[str, torch.Tensor], path: str | Path,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json (from `spec.to_hf_config()`) and model.safetensors; returns the directory."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # topk_method / scoring_func are in the official DeepSeek-V3 config.json; vLLM reads them (transformers
    # hard-codes sigmoid + noaux_tc), without them vLLM builds a softmax router with no correction bias.
    config = spec.to_hf_config(dtype=str(dtype).removeprefix("torch."), eos_token_id=None, bos_token_id=None,
                               topk_method="noaux_tc", scoring_func="sigmoid")
    config.save_pretrained(path)
    # safetensors refuses shared/non-contiguous storage; write each tensor as its own contiguous copy.
    save_file({k: v.detach().contiguous().clone() for k, v in state_dict.items()}, str(path / "model.safetensors"))
    return path


def read_model_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a model directory's *.safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise BadInput(f"{path}: no *.safetensors files; point at a model directory (write_model_dir makes one)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out
