"""Self-test of the training-side scale probe (harness.engines.megatron_probe): the kernel-argument recorder sees
seed 001's MindSpeed bug, which lives in the attention forward, not in the MLA module.

MindSpeed and torch_npu cannot run here (no CANN), so the seeded stack reproduces the two upstream versions of
`dot_product_attention_forward_impl` (mindspeed/core/transformer/flash_attention/flash_attention/adaptor.py):
v2.2.0_core_r0.12.1 passes `1/sqrt(hidden_size_per_attention_head)` when `scale_mask_softmax.scale is None`,
v2.3.0_core_r0.12.1 passes `self.softmax_scale`. The kernel is a CPU attention reached through a module attribute,
as the adaptor reaches torch_npu.npu_fusion_attention; the probe wraps it exactly as it wraps torch_npu's.
"""
from __future__ import annotations

import math
import types

import pytest
import torch

from harness.config.models import DEEPSEEK_V3, TINY
from harness.engines.megatron_probe import mla_config_kwargs, record_kwarg
from harness.markers import requires
from harness.mla.checks import check_scale
from harness.mla.derive import softmax_scale


def _cpu_fusion_attention(query, key, value, head_num, input_layout, *, scale, **_):
    """npu_fusion_attention's SBH contract on CPU: [s, b, n*d] in, softmax(q k^T * scale) v out (first of a tuple)."""
    s, b, _ = query.shape
    q, k, v = (x.view(s, b, head_num, -1).permute(1, 2, 0, 3) for x in (query, key, value))
    probs = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
    return ((probs @ v).permute(2, 0, 1, 3).reshape(s, b, -1),)


kernels = types.SimpleNamespace(npu_fusion_attention=_cpu_fusion_attention)


class SeededCoreAttention:
    """The state Megatron's DotProductAttention holds under MindSpeed's MLA: softmax_scale from the MLA module,
    hidden_size_per_attention_head from kv_channels, no query-key layer scaling (scale_mask_softmax.scale None)."""

    def __init__(self, spec, kv_channels: int, fixed: bool):
        self.softmax_scale = softmax_scale(spec)
        self.hidden_size_per_attention_head = kv_channels
        self.scale_mask_softmax = types.SimpleNamespace(scale=None)
        self.fixed = fixed

    def forward(self, query, key, value):
        if self.fixed:  # v2.3.0_core_r0.12.1
            scale = self.softmax_scale
        else:  # v2.2.0_core_r0.12.1
            scale = (1.0 / math.sqrt(self.hidden_size_per_attention_head)
                     if self.scale_mask_softmax.scale is None else self.softmax_scale)
        n = query.shape[2]
        flat = [x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value)]
        return kernels.npu_fusion_attention(*flat, n, "SBH", scale=scale)[0]


def _probe(spec, fixed: bool):
    attn = SeededCoreAttention(spec, kv_channels=spec.qk_rope_head_dim, fixed=fixed)
    g = torch.Generator().manual_seed(0)
    n, s = spec.num_attention_heads, 5
    q, k = (torch.randn(s, 1, n, spec.qk_head_dim, generator=g) for _ in range(2))
    v = torch.randn(s, 1, n, spec.v_head_dim, generator=g)
    seen: list = []
    with record_kwarg(kernels, "npu_fusion_attention", "scale", seen):
        out = attn.forward(q, k, v)
    assert kernels.npu_fusion_attention is _cpu_fusion_attention, "the recorder must restore the kernel"
    assert out.shape == (s, 1, n * spec.v_head_dim) and torch.isfinite(out).all()
    return attn, seen


@pytest.mark.parametrize("spec", [DEEPSEEK_V3, TINY], ids=lambda s: s.name)
def test_recorder_sees_the_v220_bug_the_module_hides(spec):
    attn, seen = _probe(spec, fixed=False)
    assert check_scale("module", spec, attn.softmax_scale).ok, "the bug is not in the module: it reads right"
    assert seen == [1 / math.sqrt(spec.qk_rope_head_dim)]
    finding = check_scale("mindspeed v2.2.0 kernel", spec, seen[0])
    assert not finding.ok and "softmax scale" in finding.message()


@pytest.mark.parametrize("spec", [DEEPSEEK_V3, TINY], ids=lambda s: s.name)
def test_recorder_passes_the_v230_fix(spec):
    _, seen = _probe(spec, fixed=True)
    assert len(seen) == 1 and check_scale("mindspeed v2.3.0 kernel", spec, seen[0]).ok


def test_config_fields_follow_the_release():
    """original_max_position_embeddings exists only from core_r0.14.0; before, yarn reads max_position_embeddings."""
    old = {"num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "rotary_scaling_factor",
           "kv_channels", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mscale"}
    kw = mla_config_kwargs(DEEPSEEK_V3, old, 64)
    assert kw["max_position_embeddings"] == 4096 and "original_max_position_embeddings" not in kw
    assert set(kw) <= old
    kw = mla_config_kwargs(DEEPSEEK_V3, old | {"original_max_position_embeddings"}, 64)
    assert kw["original_max_position_embeddings"] == 4096 and "max_position_embeddings" not in kw


def test_moonlights_missing_q_lora_is_passed_not_dropped():
    """Moonlight has no query LoRA (q_lora_rank None); dropping the key let core_v0.12.1's MLATransformerConfig
    default of 512 build a low-rank query the model does not have."""
    from harness.config.models import MOONLIGHT_16B

    fields = {"q_lora_rank", "kv_lora_rank", "kv_channels", "num_layers"}
    kw = mla_config_kwargs(MOONLIGHT_16B, fields, None)
    assert "q_lora_rank" in kw and kw["q_lora_rank"] is None and "kv_channels" not in kw
    assert mla_config_kwargs(DEEPSEEK_V3, fields, 64)["q_lora_rank"] == DEEPSEEK_V3.q_lora_rank == 1536


@requires(packages=["megatron.core"])
def test_megatron_probe_in_a_subprocess():
    """The real probe, end to end: megatron-core builds DeepSeek-V3's MLA at world size 1 and reports one JSON line."""
    from harness.engines.training import training_scale

    # the suite's model set: one subprocess serves both (training_scale caches per stack and model set)
    measured = training_scale("megatron", "deepseek-v3", models=("deepseek-v3", "moonlight-16b-a3b", "tiny-dsv3"))
    assert measured.versions.get("megatron-core")
    assert measured.kernel_scales == (pytest.approx(softmax_scale(DEEPSEEK_V3), rel=1e-9),)


def test_probe_failure_is_one_line():
    from harness.engines.training import training_scale
    from harness.errors import HarnessError

    with pytest.raises(HarnessError) as err:
        training_scale("megatron", "no-such-model")
    assert "unknown model" in str(err.value) and "\n" not in str(err.value)
