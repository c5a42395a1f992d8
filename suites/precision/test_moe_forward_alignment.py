"""The rollout engine and the trainer's forward give the same log-probs on the MoE model.

The MLA forward alignment runs a model whose layers are all dense, so a router bug is invisible to it. Held-out
engines with a plain top-k instead of DeepSeek-V3's group-limited top-k (the best `topk_group` of `n_group` expert
groups first: MOE_SPEC has 4 groups, top-2) moved log-probs by up to 10, and gating weights taken from the
bias-corrected scores (the e_score_correction_bias is for the choice only) by about 1.0, and passed every suite.
Here the engine under test, built fresh on the tiny MoE DeepSeek-V3 (3 dense + 2 MoE layers), is compared with
transformers' DeepseekV3 (fp32, teacher-forced on the rollout's tokens), whose router does both right
(modeling_deepseek_v3.py DeepseekV3MoE.route_tokens_to_experts). In bf16 a near-tie route flip moves one step's
distribution: a few whole steps may be off (harness.mla.checks ROUTE_FLIP_STEPS), none in fp32.
"""
import pytest

from fixtures.engines import MOE_SPEC, PROMPTS
from harness.mla.checks import compare_moe_logprobs


@pytest.mark.tiny
def test_grouped_routing_differs_from_plain_topk():
    """The sensitivity guard: with one group, or all groups kept, grouped top-k is plain top-k and the plain
    top-k bug could not show."""
    assert 1 < MOE_SPEC.topk_group < MOE_SPEC.n_group, (MOE_SPEC.n_group, MOE_SPEC.topk_group)


@pytest.mark.tiny
def test_moe_rollout_logprobs_match_training_forward(engine_kind, mla_dtype, moe_fresh_run, moe_hf_training,
                                                     record_property, expect):
    rollout = moe_fresh_run.rollout
    training = [moe_hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, rollout.token_ids, strict=True)]
    alignment = compare_moe_logprobs(f"{engine_kind.name} MoE rollout vs transformers DeepseekV3",
                                     rollout.dist_logprobs, training, mla_dtype)
    record_property("moe.forward_alignment", {"engine": engine_kind.name, "worst": alignment.alignment.worst,
                                              "off_steps": alignment.off_steps, "steps": alignment.steps,
                                              "allowed": alignment.allowed})
    expect(alignment)
