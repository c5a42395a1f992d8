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

pytestmark = pytest.mark.tiny


def test_router_replay_end_to_end(routing_run, record_property, expect):
    """With replay: 100 % top-k agreement on every MoE layer, and the log-prob gap no larger than without replay
    (within the dtype's log-prob tolerance)."""
    run = routing_run
    result = check_replay(run.engine, run.rollout.routed_experts, run.rollout.logprobs, run.replayed(),
                          run.native, run.spec, run.dtype)
    record_property("routing.replay", result.to_json())
    expect(result)
