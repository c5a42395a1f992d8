"""The training side's MLA softmax scale: (qk_nope + qk_rope)^-0.5 * mscale^2 must be what reaches the attention
kernel of the actor's forward, not only what the MLA module stores.

Seed 001 (精度问题2): on Ascend, MindSpeed v2.2.0_core_r0.12.1's fused attention passed 1/sqrt(head dim) to
torch_npu.npu_fusion_attention while the MLA module held the right scale (fixed in v2.3.0_core_r0.12.1), so a check
that reads the module passes on the bug: the MindSpeed probe records the kernel's `scale=` in a forward with flash
attention on (harness.engines.megatron_probe, in a subprocess: MindSpeed's adaptor patches the whole process).
Megatron-core (the GPU baseline) is built for real on any machine with megatron-core installed -- the CPU tier
installs core_r0.12.1, MindSpeed's line -- and must hand its core attention the closed form.
"""
import pytest

from harness.config.models import DEEPSEEK_V3, MOONLIGHT_16B, TINY
from harness.engines.training import training_scale
from harness.markers import requires
from harness.mla.checks import check_scale

MODELS = {m.name: m for m in (DEEPSEEK_V3, MOONLIGHT_16B, TINY)}


def _check_kernel(measured, spec, record_property, expect):
    record_property("mla.training_scale", {"stack": measured.stack, "model": spec.name,
                                           "module_scale": measured.module_scale,
                                           "kernel_scales": list(measured.kernel_scales),
                                           "versions": measured.versions})
    # Sensitivity guard: a probe that saw no kernel call could not see a wrong scale either.
    assert measured.kernel_scales, f"{measured.name}: no attention kernel call was recorded for {spec.name}"
    findings = [check_scale(f"{measured.name} kernel", spec, s) for s in measured.kernel_scales]
    worst = max(findings, key=lambda f: f.rel_error)
    expect(check_scale(f"{measured.name} module", spec, measured.module_scale), worst)


@pytest.mark.layer
@requires(packages=["megatron.core"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_megatron_mla_scale_is_closed_form(model, record_property, expect):
    """megatron-core's MultiLatentAttention (world size 1) computes the closed form and hands it to its core
    attention, for DeepSeek-V3 (yarn, mscale^2), Moonlight (no yarn) and the tiny model."""
    _check_kernel(training_scale("megatron", model, models=tuple(MODELS)), MODELS[model], record_property, expect)


@pytest.mark.layer
@pytest.mark.npu
@requires(hardware="npu", packages=["mindspeed", "megatron.core", "torch_npu"])
@pytest.mark.parametrize("model", ["deepseek-v3", "moonlight-16b-a3b"])
def test_mindspeed_flash_attention_scale_is_closed_form(model, record_property, expect):
    """MindSpeed with --use-flash-attn: every scale= reaching torch_npu.npu_fusion_attention in an MLA forward is the
    closed form (v2.2.0_core_r0.12.1 passes 1/sqrt(head dim) there; v2.3.0_core_r0.12.1 fixed it)."""
    measured = training_scale("mindspeed", model, models=("deepseek-v3", "moonlight-16b-a3b"))
    _check_kernel(measured, MODELS[model], record_property, expect)
