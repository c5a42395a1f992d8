"""Self-tests of the routing checkers (harness.consistency.routing) on the consistency suites' real rollout (vLLM
returning its routed experts) and the trainer's forward: each seeded bug fails, the correct path passes (the
suites, suites/consistency/, assert the latter)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.consistency.routing import ReplayFault, check_agreement, check_replay, check_routes

pytestmark = pytest.mark.tiny


def _agreement(run, routes):
    return check_agreement("seeded", routes, run.native.routes, run.native.choice, run.spec, run.dtype)


def test_near_ties_make_real_flips(routing_run):
    """The near-tied experts flip some routes between vLLM and the trainer (so "first flips must be near ties" is
    exercised), and every first flip is within the tie tolerance."""
    agreement = _agreement(routing_run, routing_run.rollout.routed_experts)
    assert any(la.disagreements for la in agreement.layers), agreement.message()
    assert agreement.ok, agreement.message()


def test_all_zero_routes_fail(routing_run):
    """The capturer never bound (or read before any forward): every row zero."""
    zeros = [torch.zeros_like(r) for r in routing_run.rollout.routed_experts]
    result = check_routes("seeded", zeros, routing_run.spec, routing_run.rows)
    assert not result.ok and "MoE row without 4 distinct ids" in result.message()


def test_routes_with_the_last_token_row_fail(routing_run):
    """One row too many (a route for the final token, which is never fed forward) or one too few."""
    run = routing_run
    longer = [torch.cat([r, r[-1:]]) for r in run.rollout.routed_experts]
    assert "expected" in check_routes("seeded", longer, run.spec, run.rows).message()
    assert not check_routes("seeded", [r[1:] for r in run.rollout.routed_experts], run.spec, run.rows).ok


def test_dense_layers_with_routes_fail(routing_run):
    run = routing_run
    bad = [r.clone() for r in run.rollout.routed_experts]
    bad[0][:, 0] = bad[0][:, run.spec.first_k_dense_replace]
    assert "dense layer with routes" in check_routes("seeded", bad, run.spec, run.rows).message()


@pytest.mark.parametrize("corrupt", ["layers_swapped", "token_shift"])
def test_misplaced_rollout_routes_fail_agreement(routing_run, corrupt):
    """Routes written to the other MoE layer, or one token late: disagreements at a wide margin, not near ties."""
    run = routing_run
    moe = list(range(run.spec.first_k_dense_replace, run.spec.num_hidden_layers))
    bad = []
    for r in run.rollout.routed_experts:
        r = r.clone()
        if corrupt == "layers_swapped":
            r[:, moe] = r[:, moe[::-1]]
        else:
            r[1:] = r[:-1].clone()
        bad.append(r)
    agreement = _agreement(run, bad)
    assert not agreement.ok and "wide margin" in agreement.message(), agreement.message()


@pytest.mark.parametrize("fault", list(ReplayFault), ids=[f.value for f in ReplayFault])
def test_seeded_replay_layouts_fail(routing_run, fault):
    """Each seeded replay-layout bug: the trainer no longer uses the rollout's experts (agreement < 100 %)."""
    run = routing_run
    result = check_replay(f"replay[{fault.value}]", run.rollout.routed_experts, run.rollout.logprobs,
                          run.replayed(fault), run.native, run.spec, run.dtype)
    assert not result.ok and not result.agreement.ok, result.message()


def test_replay_of_another_rollouts_routes_fails(routing_run):
    """Routes of another sequence of the batch (a batch reordered between rollout and training)."""
    run = routing_run
    order = [2, 3, 0, 1]  # lengths 5, 12, 7, 3 prompts: mismatched rows are refused outright
    swapped = dataclasses.replace(run, rollout=dataclasses.replace(
        run.rollout, routed_experts=[run.rollout.routed_experts[i] for i in order]))
    with pytest.raises(ValueError, match="route rows"):
        swapped.replayed()


@pytest.fixture(scope="module")
def replay_gradients(pytestconfig):
    """The router gradients of verl's R3 on the installed megatron-core (harness.engines.router_replay_probe)."""
    from harness.config.hardware import module_exists
    from harness.markers import skip_or_fail

    missing = [m for m in ("verl", "megatron") if not module_exists(m)]
    if missing:
        skip_or_fail(pytestconfig, f"package {', '.join(missing)} (verl's router replay runs on megatron-core)")
    from harness.engines.router_replay_probe import router_replay_outcomes

    return router_replay_outcomes()["gradients_ungrouped"]


def test_a_replay_that_detaches_the_scores_fails_the_gradient_check(replay_gradients):
    """ISEEKYAN/Megatron-LM#79's class, seeded in the probe (the replayed probs leave the graph): the router gets
    no gradient, which the forward-only R3 checks cannot see; the real replay passes."""
    from harness.consistency.routing import RouterGradients

    grads = replay_gradients
    assert "error" not in grads, grads.get("error")
    seeded = RouterGradients.of("seeded", grads, "replay_detached")
    assert not seeded.ok and "Megatron-LM#79" in seeded.message(), seeded.message()
    assert RouterGradients.of("real", grads).ok and grads["native"] > 0
    # a gradient of the same norm but another direction fails too: the elements are compared, not the norms
    turned = RouterGradients("turned", native=grads["native"], replay=grads["native"],
                             max_abs_diff=grads["native"] / 10)
    assert not turned.ok
