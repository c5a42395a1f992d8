"""Router replay (R3) end to end: the rollout's routes replayed into the trainer's forward make it use the
rollout's experts on every token of every MoE layer, and the rollout/training log-prob gap shrinks to float noise.

verl 0.9.1's R3 (`actor_rollout_ref.rollout.enable_rollout_routing_replay` +
`actor_rollout_ref.actor.megatron.router_replay.mode=R3`) takes vLLM's `routed_experts` and replays them in
Megatron's TopKRouter (verl/utils/megatron/router_replay_patch.py, router_replay_utils.py). The layout is where it
goes wrong: a missing final-token row, left padding, absolute vs MoE-ordinal layer index
(harness.consistency.routing.replay_targets follows verl's; tests/test_routing_seeded.py shows each seeded layout
bug fail this check). Here the trainer is transformers' DeepseekV3 (HFTrainingModel.routed_forward replays as
verl's patch does); `test_verl_router_replay_on_megatron_core` runs verl's own patch on the installed
megatron-core.
"""
import pytest

from harness.consistency.routing import check_replay
from harness.markers import upstream_failure

pytestmark = pytest.mark.tiny


def test_router_replay_end_to_end(routing_run, record_property, expect):
    """With replay: 100 % top-k agreement on every MoE layer, and the log-prob gap no larger than without replay
    (within the dtype's log-prob tolerance)."""
    run = routing_run
    result = check_replay(run.engine, run.rollout.routed_experts, run.rollout.logprobs, run.replayed(),
                          run.native, run.spec, run.dtype)
    record_property("routing.replay", result.to_json())
    expect(result)


@pytest.fixture(scope="module")
def verl_replay(pytestconfig):
    """What verl 0.9.1's router_replay_patch does on the installed megatron-core (harness.engines.router_replay_probe,
    in a subprocess: megatron-core's own TopKRouter, DeepSeek-V3 routing, every replay action verl uses)."""
    from harness.config.hardware import module_exists
    from harness.markers import skip_or_fail

    missing = [m for m in ("verl", "megatron") if not module_exists(m)]
    if missing:
        skip_or_fail(pytestconfig, f"package {', '.join(missing)} (verl's router replay runs on megatron-core)")
    from harness.engines.router_replay_probe import router_replay_outcomes

    return router_replay_outcomes()


def _r3_blocked() -> bool:
    from harness.config.stacks import megatron_moe_utils_source, missing_replay_names

    source = megatron_moe_utils_source()
    return source is not None and bool(missing_replay_names(source))


@upstream_failure(AssertionError, r"NameError: name 'group_limited_topk' is not defined", condition=_r3_blocked(),
                  reason="verl 0.9.1 utils/megatron/router_replay_patch.py imports group_limited_topk, "
                         "apply_router_token_dropping and compute_routing_scores_for_aux_loss from megatron-core's "
                         "moe_utils in one try block; core_r0.12.1 lacks the last two, so group_limited_topk stays "
                         "unbound and DeepSeek-V3's group-limited TopKRouter raises NameError (RECORD, R3's masked "
                         "replay, native forward). Flips to XPASS on a megatron-core whose moe_utils has all three")
def test_verl_router_replay_on_megatron_core(verl_replay, record_property):
    """verl's own R3 machinery on DeepSeek-V3's grouped routing: every replay action verl uses works."""
    record_property("routing.verl_replay_probe", verl_replay)
    assert set(verl_replay["grouped"].values()) == {"ok"}, verl_replay


@pytest.mark.parametrize("router", [
    "ungrouped",
    pytest.param("grouped", marks=upstream_failure(
        AssertionError, r"NameError: name 'group_limited_topk' is not defined", condition=_r3_blocked(),
        reason="the grouped router's forward raises on core_r0.12.1 (above), so R3's backward cannot run there")),
])
def test_router_replay_keeps_the_router_gradient(verl_replay, router, record_property, expect):
    """R3's backward on megatron-core's TopKRouter with verl's patch: the router weight's gradient under replay
    equals the native forward's with the same routes (harness.consistency.routing.RouterGradients;
    tests/test_routing_seeded.py shows a replay whose probs leave the graph -- Megatron-LM#79 -- fail it)."""
    from harness.consistency.routing import RouterGradients

    grads = verl_replay[f"gradients_{router}"]
    record_property("routing.router_gradients", {"router": router, **grads})
    assert "error" not in grads, grads["error"] if "error" in grads else grads
    expect(RouterGradients.of(router, grads))


def test_verl_router_replay_works_without_the_group_limit(verl_replay):
    """The same patch on an ungrouped router (Qwen3-MoE style) records and replays on this megatron-core: the probe
    can see a working replay, so the failure above is the group limit's, not the probe's."""
    assert set(verl_replay["ungrouped"].values()) == {"ok"}, verl_replay
