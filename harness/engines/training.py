"""Training-side MLA: the naive (non-absorbed) forward the actor computes log-probs with.

`HFTrainingModel` is transformers' DeepseekV3ForCausalLM (the reference: eager attention, k/v expanded through
kv_b_proj, scale from `yarn_apply_mscale`). Megatron-core / MindSpeed MLA (the NPU training stack whose
softmax scale was wrong, seed 001 精度问题2) are reached through `megatron_mla_softmax_scale`, imported lazily
and used behind `requires(packages=[...])`.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from harness.config.models import ModelSpec
from harness.engines.base import torch_threads
from harness.engines.weights import write_model_dir


class HFTrainingModel:
    """transformers DeepseekV3ForCausalLM built from a model directory or a state dict (random weights only)."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor] | str | Path, *,
                 dtype: torch.dtype = torch.float32, tmp_dir: str | Path | None = None):
        from transformers import AutoModelForCausalLM

        self.spec, self.dtype = spec, dtype
        if not isinstance(weights, (str, Path)):
            if tmp_dir is None:
                raise ValueError("HFTrainingModel(state_dict) needs tmp_dir to write the model directory")
            weights = write_model_dir(spec, weights, tmp_dir, dtype=dtype)
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=dtype,
                                                          attn_implementation="eager").eval()

    def attention_layers(self) -> list:
        return [layer.self_attn for layer in self.model.model.layers]

    def softmax_scale(self) -> float:
        return float(self.attention_layers()[0].scaling)

    @contextlib.contextmanager
    def softmax_scale_set(self, scale: float):
        """Within the block every attention layer uses `scale` (to build the wrong-scale comparison)."""
        saved = [attn.scaling for attn in self.attention_layers()]
        for attn in self.attention_layers():
            attn.scaling = scale
        try:
            yield self
        finally:
            for attn, old in zip(self.attention_layers(), saved, strict=True):
                attn.scaling = old

    @torch.no_grad()
    def response_logprobs(self, prompt: list[int], response: list[int]) -> torch.Tensor:
        """log-softmax [len(response), vocab] at the positions that predict each response token — what the actor
        computes for the rollout's tokens (teacher forcing)."""
        ids = torch.tensor([prompt + response])
        with torch_threads(1):  # tiny shapes (see harness.engines.base.torch_threads)
            logits = self.model(ids).logits[0].float()
        return logits[len(prompt) - 1: len(prompt) - 1 + len(response)].log_softmax(-1)


def megatron_mla_softmax_scale(spec: ModelSpec) -> float:
    """The softmax scale Megatron-core's MLA self-attention computes for `spec`, read from a module built on the
    meta device (MindSpeed patches this module on NPU: import mindspeed first to read MindSpeed's value).
    Needs megatron-core with its parallel state initialised; call it only behind
    `requires(packages=["megatron.core"])`. Not exercised on the CPU CI (megatron-core is not pinned there)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    rope = spec.rope_scaling
    config = MLATransformerConfig(
        num_layers=1, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_head_dim=spec.qk_nope_head_dim,
        qk_pos_emb_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
        rope_type="yarn" if rope else "rope", rotary_scaling_factor=rope.factor if rope else 1.0,
        mscale=rope.mscale if rope else 1.0, mscale_all_dim=rope.mscale_all_dim if rope else 1.0,
        original_max_position_embeddings=rope.original_max_position_embeddings if rope else 4096,
    )
    attn_spec = get_gpt_layer_local_spec(multi_latent_attention=True).submodules.self_attention
    with torch.device("meta"):
        attn = build_module(attn_spec, config=config, layer_number=1)
    return float(attn.softmax_scale)
