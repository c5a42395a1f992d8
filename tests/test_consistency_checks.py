"""Unit self-tests of the consistency checkers' logic on constructed data (the real-engine self-tests are
tests/test_routing_seeded.py and the `--engine` cases of tests/test_mla_seeded.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.config.models import TINY
from harness.consistency.invariance import Generation, compare, float32_bits
from harness.consistency.routing import ReplayFault, check_agreement, replay_targets

SPEC = dataclasses.replace(TINY, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                           num_experts_per_tok=2, n_group=1, topk_group=1)


def test_bits_and_first_divergences():
    alone = Generation((1, 2, 3, 4), (-0.5, -1.0, -2.0, -0.25))
    assert compare("again", alone, alone, judged=True).equal
    nudged = Generation(alone.tokens, (-0.5, -1.0, float(torch.tensor(-2.0).nextafter(torch.tensor(0.0))), -0.25))
    c = compare("batch", alone, nudged, judged=False)
    assert (c.first_token, c.first_bits) == (None, 2) and 0 < c.max_abs < 1e-6
    diverged = Generation((1, 2, 9, 9), (-0.5, -1.0, -3.0, -1.0))
    c = compare("batch", alone, diverged, judged=True)
    assert (c.first_token, c.first_bits) == (2, 2) and "tokens diverge at position 2" in c.describe()
    assert float32_bits([0.0]) != float32_bits([-0.0])  # bit patterns, not values


def _routes(rows):
    """[n, 3 layers, 2]: layer 0 dense (zeros), layers 1-2 from `rows` [(l1 ids, l2 ids), ...]."""
    return torch.tensor([[[0, 0], list(a), list(b)] for a, b in rows])


def test_a_flip_is_allowed_at_a_near_tie_and_downstream_of_one():
    choice = torch.zeros(4, 3, 8)
    choice[:, 1, :] = torch.tensor([0.9, 0.8, 0.5, 0.5 + 1e-6, 0.1, 0.1, 0.1, 0.1])  # experts 2 / 3 near-tied
    choice[:, 2, :] = torch.tensor([0.9, 0.1, 0.8, 0.1, 0.1, 0.1, 0.1, 0.7])  # 1 vs 7: a wide margin
    train = _routes([((0, 3), (0, 2))] * 4)
    rollout = _routes([((0, 3), (0, 2)), ((0, 2), (0, 2)), ((0, 3), (0, 2)), ((0, 3), (0, 2))])
    ok = check_agreement("near tie", [rollout], [train], [choice], SPEC, torch.float32)
    assert ok.ok and ok.layers[0].agreed == 3 and ok.layers[0].disagreements[0].gap < 1e-5
    downstream = rollout.clone()
    downstream[2, 2] = torch.tensor([0, 7])  # token 2, layer 2: after the layer-1 flip at token 1
    result = check_agreement("downstream", [downstream], [train], [choice], SPEC, torch.float32)
    assert result.ok and result.layers[1].disagreements[0].downstream
    early = rollout.clone()
    early[0, 2] = torch.tensor([0, 7])  # token 0, layer 2: before any flip, at a wide margin
    result = check_agreement("early", [early], [train], [choice], SPEC, torch.float32)
    assert not result.ok and "layer 2: 1 first flips at a wide margin" in result.message()


def test_replay_layout_and_its_seeded_faults():
    """Two sequences, prompts of 3 and 1 tokens, responses of 2: rows P+R-1 each, placed at the real tokens of the
    left-padded batch, final row native."""
    routes = [torch.arange(4 * 3 * 2).view(4, 3, 2), 100 + torch.arange(2 * 3 * 2).view(2, 3, 2)]
    targets, mask = replay_targets(routes, [3, 1], [2, 2], SPEC)
    assert mask.tolist() == [[True, True, True, True, False], [False, False, True, True, False]]
    assert torch.equal(targets[1, 2:4], routes[1]) and torch.equal(targets[0, :4], routes[0])
    shifted, _ = replay_targets(routes, [3, 1], [2, 2], SPEC, ReplayFault.SHIFTED)
    assert torch.equal(shifted[0, 1:5], routes[0])
    unpadded, _ = replay_targets(routes, [3, 1], [2, 2], SPEC, ReplayFault.IGNORE_LEFT_PADDING)
    assert torch.equal(unpadded[1, 0:2], routes[1])
    ordinal, _ = replay_targets(routes, [3, 1], [2, 2], SPEC, ReplayFault.MOE_ORDINAL)
    assert torch.equal(ordinal[0, :4, 1], routes[0][:, 0])  # layer 1 took layer 0's (dense) rows
    reversed_, _ = replay_targets(routes, [3, 1], [2, 2], SPEC, ReplayFault.REVERSED_LAYERS)
    assert torch.equal(reversed_[0, :4, 1], routes[0][:, 2])
    with pytest.raises(ValueError, match="expected 4"):
        replay_targets([routes[0][:3], routes[1]], [3, 1], [2, 2], SPEC)


def test_a_claim_is_judged_in_its_own_process_with_the_mode_on():
    """The platform's batch-invariant mode patches torch for the whole process (vllm-ascend v0.23.0
    batch_invariant.py), so the suite turns it on in a fresh process only: there the engine claims and is judged;
    this process never sees the mode."""
    import os

    from seeded_engines import MODE_ENV, mode_invariant

    from harness.consistency.invariance import measure_with_mode
    from harness.engines.isolation import in_fresh_process

    others = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15]]
    judged = in_fresh_process(measure_with_mode, mode_invariant, {MODE_ENV: "1"},
                              dict(spec=TINY, weights=None, load_format="dummy", dtype=torch.float32, seed=0),
                              [1, 2, 3, 4], others, 4)
    assert judged.claimed and judged.invariant and len(judged.cases) == 3, judged.to_json()
    assert MODE_ENV not in os.environ


def test_determinism_and_invariance_are_separate_verdicts():
    """An engine that claims invariance and breaks it in a batch is deterministic still (issue 31: its batch
    difference also failed the determinism test); a repeat that differs fails determinism, not invariance."""
    from harness.consistency.invariance import REPEAT, BatchInvariance

    alone = Generation((1, 2), (-0.5, -1.0))
    nudged = Generation((1, 2), (-0.5, -1.0000001))
    batch_variant = BatchInvariance("e", True, (compare(REPEAT, alone, alone, judged=True),
                                                compare("first of a batch of 8", alone, nudged, judged=True)))
    assert batch_variant.determinism().ok, batch_variant.determinism().message()
    inv = batch_variant.invariance()
    assert not inv.ok and "claims batch invariance, but" in inv.message() and len(inv.findings()) == 1
    flaky = BatchInvariance("e", True, (compare(REPEAT, alone, nudged, judged=True),
                                        compare("first of a batch of 8", alone, alone, judged=True)))
    det = flaky.determinism()
    assert not det.ok and "not deterministic" in det.message() and len(det.findings()) == 1
    assert flaky.invariance().ok
