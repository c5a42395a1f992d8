"""The rollout engine and the trainer route each token to the same experts, up to near ties.

MoE RL collapses when the rollout samples from another sub-network than the one trained: small numeric differences
flip near-tied top-k choices (Rollout Routing Replay, R3, arXiv 2510.11370; verl PRs #4101 / #5185). vllm-ascend's
own routed-experts e2e test only asserts `routed_experts.size > 0`. Here the tiny MoE DeepSeek-V3 (3 dense + 2 MoE
layers, grouped routing, near-tied experts on purpose: fixtures/consistency.py) is rolled out by the engine under
test (reference, vLLM, or `--engine`) returning its routes, and the trainer's forward (transformers DeepseekV3) runs
the same tokens: every route must be well formed, and per MoE layer the top-k sets must agree except at near ties
(harness.consistency.routing).
"""
import pytest

from harness.consistency.routing import check_agreement, check_routes

pytestmark = pytest.mark.tiny


def test_rollout_routes_are_well_formed(routing_run, expect):
    """[prompt + output - 1, num_hidden_layers, top_k] per sequence, k distinct ids in every MoE row, dense rows
    empty (the all-zero-routes and off-by-one-row bug classes)."""
    run = routing_run
    expect(check_routes(run.engine, run.rollout.routed_experts, run.spec, run.rows))


def test_trainer_routes_like_the_rollout(routing_run, record_property, expect):
    """Per MoE layer, the share of tokens whose top-k sets agree (recorded for the report's per-layer plot); every
    disagreement must be a near tie under the trainer's choice scores."""
    run = routing_run
    agreement = check_agreement(f"{run.engine} vs transformers DeepseekV3", run.rollout.routed_experts,
                                run.native.routes, run.native.choice, run.spec, run.dtype)
    record_property("routing.agreement", agreement.to_json())
    expect(agreement)
