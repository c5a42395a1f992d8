"""The MLA softmax scale is (qk_nope + qk_rope)^-0.5 * mscale^2, in the engine and in its outputs.

Seed 001 (精度问题2): MindSpeed's MLA passed kv_channels (128) where DeepSeek needs q_head_dim (192), so training
used 1/sqrt(128) instead of 1/sqrt(192) * mscale^2 — 53% off for DSV3 — and the actor drifted from the rollout.
TINY keeps the same trap at small dims: qk_nope 64, rope 64, v_head 64, yarn 40 -> right 0.1657 vs wrong 0.125.
"""
import pytest
import torch

from fixtures.engines import PROMPTS, SCALE_MODELS, SCALE_SPECS
from harness.mla.checks import check_scale, compare_logprobs
from harness.mla.derive import softmax_scale, wrong_scales


@pytest.mark.tiny
@pytest.mark.parametrize("model", sorted(SCALE_MODELS))
def test_engine_scale_is_closed_form(engine_kind, model, request, record_property, expect):
    """DSV3 and Moonlight are built as attention twins (their attention dims and rope scaling, tiny elsewhere);
    tiny reads the session's fresh engine instead of starting another."""
    if model == "tiny":
        fresh = request.getfixturevalue("fresh_run")
        finding = check_scale(fresh.engine, SCALE_SPECS[model], fresh.softmax_scale)
    else:
        with engine_kind.make(SCALE_MODELS[model], weights=None, load_format="dummy", dtype=torch.float32,
                              seed=0) as engine:
            finding = check_scale(engine.name, SCALE_SPECS[model], engine.softmax_scale())
    record_property("mla.softmax_scale", {"engine": finding.engine, "model": model, "expected": finding.expected,
                                          "actual": finding.actual, "rel_error": finding.rel_error})
    expect(finding)


@pytest.mark.tiny
def test_outputs_follow_right_scale(engine_kind, mla_spec, fresh_rollout, hf_training, record_property):
    """Behavioural: the engine's per-step log-probs match transformers' forward at the right scale and are
    measurably far from the same forward at MindSpeed's 1/sqrt(v_head_dim) (the sensitivity guard)."""
    wrong = wrong_scales(mla_spec)["v_head_dim"]
    right = softmax_scale(mla_spec)
    assert right / wrong - 1 >= 0.30, "tiny dims must put the right scale >= 30% above the MindSpeed one (DSV3: 53%)"
    toks = fresh_rollout.token_ids
    at_right = [hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, toks, strict=True)]
    with hf_training.softmax_scale_set(wrong):
        at_wrong = [hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, toks, strict=True)]
    vs_right = compare_logprobs(f"{engine_kind.name} vs transformers at scale {right:.4f}",
                                    fresh_rollout.dist_logprobs, at_right, torch.float32)
    vs_wrong = compare_logprobs(f"{engine_kind.name} vs transformers at scale {wrong:.4f} (v_head_dim)",
                                    fresh_rollout.dist_logprobs, at_wrong, torch.float32)
    record_property("mla.scale_behaviour", {"engine": engine_kind.name, "right_scale": right, "wrong_scale": wrong,
                                            "worst_vs_right": vs_right.worst, "worst_vs_wrong": vs_wrong.worst})
    assert vs_right.ok, (f"{vs_right.message()}; against the v_head_dim scale the worst |diff| is "
                         f"{vs_wrong.worst:.4g} — the engine's softmax scale is not "
                         f"(qk_nope+qk_rope)^-0.5*mscale^2 = {right:.7f}")
    # Sensitivity guard: the same tolerance must reject the MindSpeed scale, or this check could not fail.
    assert not vs_wrong.ok, f"the v_head_dim scale is within tolerance too ({vs_wrong.message()})"
