"""Model and scale registries against the official configs (DESIGN.md "Facts to build on")."""
from __future__ import annotations

import dataclasses
import math

import pytest

from harness.config.models import DEEPSEEK_V3, MODELS, MOONLIGHT_16B, TINY, get_model, yarn_mscale
from harness.config.scales import SCALES, TIERS, default_scale, get_scale
from harness.errors import BadInput

# deepseek-ai/DeepSeek-V3 config.json, as listed in DESIGN.md. A wrong value here silently skews the
# memory model, the softmax-scale check (MindSpeed used 128 for 192) and every reduced/full scale.
OFFICIAL_DSV3 = {
    "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048, "intermediate_size": 18432,
    "first_k_dense_replace": 3, "num_hidden_layers": 61, "vocab_size": 129280,
}
OFFICIAL_DSV3_YARN = {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}

# moonshotai/Moonlight-16B-A3B config.json: MLA without q LoRA and without yarn.
OFFICIAL_MOONLIGHT = {
    "hidden_size": 2048, "num_attention_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "n_shared_experts": 2, "moe_intermediate_size": 1408, "intermediate_size": 11264,
    "first_k_dense_replace": 1, "num_hidden_layers": 27, "vocab_size": 163840,
}


def _mismatches(spec, expected: dict) -> list[str]:
    return [f"{k}: registry {getattr(spec, k)!r} != official {v!r}"
            for k, v in expected.items() if getattr(spec, k) != v]


def test_deepseek_v3_matches_official_config():
    bad = _mismatches(DEEPSEEK_V3, OFFICIAL_DSV3) + _mismatches(DEEPSEEK_V3.rope_scaling, OFFICIAL_DSV3_YARN)
    assert not bad, f"{len(bad)} DeepSeek-V3 values differ from config.json: {'; '.join(bad)}"


def test_moonlight_matches_official_config():
    bad = _mismatches(MOONLIGHT_16B, OFFICIAL_MOONLIGHT)
    assert not bad, f"{len(bad)} Moonlight values differ from config.json: {'; '.join(bad)}"
    assert MOONLIGHT_16B.rope_scaling is None, "Moonlight has no yarn: its softmax scale is 192^-0.5"


def test_softmax_relevant_dims():
    # MLA softmax scale = (qk_nope + qk_rope)^-0.5 * mscale^2 (DESIGN.md); the MindSpeed bug used 128.
    assert DEEPSEEK_V3.qk_head_dim == 192
    mscale = yarn_mscale(DEEPSEEK_V3.rope_scaling.factor, DEEPSEEK_V3.rope_scaling.mscale_all_dim)
    assert mscale == pytest.approx(0.1 * math.log(40) + 1)
    assert DEEPSEEK_V3.qk_head_dim ** -0.5 * mscale**2 == pytest.approx(0.1352338, abs=1e-6)
    assert MOONLIGHT_16B.qk_head_dim ** -0.5 == pytest.approx(192 ** -0.5)
    # The tiny model keeps the bug visible: right scale differs from 1/sqrt(v_head_dim) by > 25%.
    tiny_mscale = yarn_mscale(TINY.rope_scaling.factor, TINY.rope_scaling.mscale_all_dim)
    right, buggy = TINY.qk_head_dim ** -0.5 * tiny_mscale**2, TINY.v_head_dim ** -0.5
    assert abs(right - buggy) / buggy > 0.25


def test_vllm_cpu_latent_constraint():
    # vLLM's CPU MLA kernels only run latent 576 (kv_lora 512 + rope 64): every model the tiny tier
    # hands to vLLM must keep it.
    for spec in MODELS.values():
        assert spec.kv_lora_rank + spec.qk_rope_head_dim == 576, spec.name


def test_parameter_counts_671b_total_37b_active():
    total, active = DEEPSEEK_V3.total_params(), DEEPSEEK_V3.total_params(active=True)
    assert total == pytest.approx(671e9, rel=0.005), f"total {total / 1e9:.2f}B, DeepSeek-V3 is 671B"
    assert active == pytest.approx(37e9, rel=0.03), f"active {active / 1e9:.2f}B, DeepSeek-V3 activates ~37B"
    assert MOONLIGHT_16B.total_params() == pytest.approx(16e9, rel=0.03)
    assert MOONLIGHT_16B.total_params(active=True) == pytest.approx(3e9, rel=0.05)


@pytest.mark.parametrize("spec", [TINY, TINY.with_layers(3, first_k_dense_replace=1)], ids=lambda s: s.name)
def test_parameter_formula_matches_transformers(spec):
    """The analytic count (memory model, roofline) equals the real HF DeepseekV3 module built from to_hf_config()."""
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM(spec.to_hf_config())
    params = sum(p.numel() for p in model.parameters())
    # HF keeps the router's e_score_correction_bias as a buffer; the analytic count includes it.
    bias = sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    assert params + bias == spec.total_params(), f"HF {params}+{bias} vs registry {spec.total_params()}"


def test_hf_config_carries_the_dims():
    cfg = DEEPSEEK_V3.to_hf_config()
    bad = [f"{k}: {getattr(cfg, k)!r} != {v!r}" for k, v in OFFICIAL_DSV3.items() if getattr(cfg, k) != v]
    assert not bad, "; ".join(bad)
    assert cfg.rope_scaling["factor"] == 40.0 and cfg.rope_scaling["mscale_all_dim"] == 1.0


def test_reduced_variant_keeps_real_dims():
    reduced = get_model("deepseek-v3-4l")
    same = {f.name for f in dataclasses.fields(DEEPSEEK_V3)} - {"name", "num_hidden_layers", "first_k_dense_replace"}
    assert all(getattr(reduced, k) == getattr(DEEPSEEK_V3, k) for k in same)
    assert (reduced.num_hidden_layers, reduced.num_dense_layers, reduced.num_moe_layers) == (4, 3, 1)


def test_unknown_names_are_one_line_errors():
    with pytest.raises(BadInput, match="known: .*deepseek-v3"):
        get_model("deepseek-v4")
    with pytest.raises(BadInput, match="known: .*full-a3"):
        get_scale("full-a4")


def test_seed_plans_and_batches():
    a2, a3 = get_scale("full-a2-gbs128"), get_scale("full-a3")
    t = a2.plan.train
    assert (a2.cards, t.tp, t.pp, t.ep, t.etp) == (256, 8, 16, 16, 1)
    assert (t.first_stage_layers, t.last_stage_layers, set(t.stage_layers[1:-1])) == (3, 2, {4})
    assert (a2.plan.rollout.tp, a2.plan.rollout.ep) == (8, 64)
    assert {(s.batch.gbs, s.batch.max_prompt_length, s.batch.max_response_length)
            for s in (a2, get_scale("full-a2-gbs32"))} == {(128, 2048, 8192), (32, 2048, 12288)}
    t = a3.plan.train
    # Seed 002's --num-layer-list 7,7,8,8,8,8,8,7 is MindSpeed-LLM's; core_r0.12.1 can only make the first and last
    # stages uneven, so the plan runs 6,8x6,7 as verl's r1_ascend 671B recipe does (same 61 layers, same peak stage).
    assert (a3.cards, a3.devices, t.tp, t.pp, t.ep, t.stage_layers) == (128, 256, 4, 8, 8, (6, 8, 8, 8, 8, 8, 8, 7))
    r = a3.plan.rollout
    assert (r.tp, r.dp, r.ep) == (2, 64, 128)
    assert (a3.batch.gbs, a3.batch.n, a3.batch.max_prompt_length, a3.batch.max_response_length) == (512, 16, 1024, 3072)
    assert a3.targets.tps_per_card == 120.0


def test_every_tier_has_a_default_scale():
    for tier in TIERS:
        assert default_scale(tier).tier == tier
    assert default_scale("full", "a2").hardware.name == "a2"
    assert all(s.tier in TIERS for s in SCALES.values())
