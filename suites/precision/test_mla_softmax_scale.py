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


def record_and_expect(finding, model, record_property, expect) -> None:
    record_property("mla.softmax_scale", {"engine": finding.engine, "model": model, "expected": finding.expected,
                                          "actual": finding.actual, "rel_error": finding.rel_error})
    expect(finding)


@pytest.mark.tiny
@pytest.mark.parametrize("model", sorted(set(SCALE_MODELS) - {"tiny"}))
def test_engine_scale_is_closed_form(engine_kind, model, engine_dtype, record_property, expect):
    """DSV3 and Moonlight, built as attention twins (their attention dims and rope scaling, tiny elsewhere)."""
    with engine_kind.make(SCALE_MODELS[model], weights=None, load_format="dummy", dtype=engine_dtype,
                          seed=0) as engine:
        finding = check_scale(engine.name, SCALE_SPECS[model], engine.softmax_scale())
    record_and_expect(finding, model, record_property, expect)


@pytest.mark.tiny
def test_tiny_engine_scale_is_closed_form(engine_kind, mla_dtype, fresh_run, record_property, expect):
    """The tiny model's scale, read from the session's fresh engine instead of starting another."""
    record_and_expect(check_scale(fresh_run.engine, SCALE_SPECS["tiny"], fresh_run.softmax_scale), "tiny",
                      record_property, expect)


@pytest.mark.tiny
def test_outputs_follow_right_scale(engine_kind, mla_dtype, mla_spec, fresh_run, hf_training, record_property):
    """Behavioural, for every engine whatever its softmax_scale() says (it caught a decode kernel using
    its own scale): the engine's per-step log-probs (step 0 prefill, later steps decode) match
    transformers' forward at the right scale. On a mismatch the scale is blamed only when the outputs match
    transformers at one of the known wrong scales; the sensitivity guard makes sure the tolerance tells
    the right scale from MindSpeed's 1/sqrt(v_head_dim)."""
    right = softmax_scale(mla_spec)
    wrong = wrong_scales(mla_spec)
    assert right / wrong["v_head_dim"] - 1 >= 0.30, "tiny dims must put the right scale >= 30% above MindSpeed's"
    rollout = fresh_run.rollout
    toks = rollout.token_ids

    def forward(scale: float | None) -> list[torch.Tensor]:
        if scale is None:
            return [hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, toks, strict=True)]
        with hf_training.softmax_scale_set(scale):
            return [hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, toks, strict=True)]

    at_right = forward(None)
    paths = {path: compare_logprobs(f"{engine_kind.name} {path} vs transformers at scale {right:.7f}",
                                    [d[first:] if first else d[:1] for d in rollout.dist_logprobs],
                                    [t[first:] if first else t[:1] for t in at_right], mla_dtype, first_step=first)
             for path, first in (("prefill step", 0), ("decode steps", 1))}
    at_wrong = {name: forward(scale) for name, scale in wrong.items()}
    # Sensitivity guard: the same tolerance must tell MindSpeed's scale from the right one, or this could not fail.
    guard = compare_logprobs("transformers at v_head_dim scale vs right scale", at_wrong["v_head_dim"], at_right,
                             mla_dtype)
    assert not guard.ok, f"the v_head_dim scale is within tolerance of the right one ({guard.message()})"
    matches = [name for name, lp in at_wrong.items()
               if compare_logprobs(name, rollout.dist_logprobs, lp, mla_dtype).ok]
    reported = check_scale(fresh_run.engine, mla_spec, fresh_run.softmax_scale)
    record_property("mla.scale_behaviour", {"engine": engine_kind.name, "right_scale": right,
                                            "reported_scale": fresh_run.softmax_scale,
                                            **{f"worst_{p.split()[0]}": a.worst for p, a in paths.items()},
                                            "matches_wrong_scale": matches})
    failing = [a for a in paths.values() if not a.ok]
    if not failing:
        return
    if matches:
        cause = (f"the outputs match attention at the {matches[0]} scale {wrong[matches[0]]:.7f}, not "
                 f"(qk_nope+qk_rope)^-0.5*mscale^2 = {right:.7f}")
    else:
        cause = ("the outputs match attention at none of the known scales (right, " + ", ".join(wrong)
                 + "), so this is not identified as a scale bug")
    pytest.fail(f"behavioural scale check failed for {fresh_run.engine} (its softmax_scale() reports "
                f"{fresh_run.softmax_scale:.7f}: {'the closed form' if reported.ok else 'NOT the closed form'}): "
                + "; ".join(a.message() for a in failing) + f"; {cause}", pytrace=False)
