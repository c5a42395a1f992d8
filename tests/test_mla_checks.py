"""Self-tests of harness.mla and the reference engine: closed forms, each checker failing on its seeded bug and
passing on the reference, the aliasing probe telling views from copies, and bad input in one line."""
from __future__ import annotations

import math

import pytest
import torch

from harness.config.models import DEEPSEEK_V3, MOONLIGHT_16B, TINY
from harness.engines.base import load_factory
from harness.engines.reference import EngineFault, ReferenceEngine
from harness.engines.weights import random_state_dict
from harness.errors import BadInput
from harness.mla.checks import SyncBehaviour, check_freshness, check_scale, compare_logprobs, probe_aliasing
from harness.mla.derive import derive_absorbed, softmax_scale, wrong_scales

SPEC = TINY
PROMPTS = [[5, 9, 13, 2], [77, 1]]


@pytest.fixture(scope="module")
def weights():
    # MLA checks: the router is beside the point, and test_small_updates_need_logprobs's premise (a 1 % update
    # leaves greedy tokens unchanged) was measured on these weights with the router bias at zero (a bias moves an
    # expert choice of TINY's MoE layer, and with it a token)
    return (random_state_dict(SPEC, seed=0, zero_router_bias=True),
            random_state_dict(SPEC, seed=1, zero_router_bias=True))


def test_closed_form_scales():
    assert softmax_scale(DEEPSEEK_V3) == pytest.approx(0.1352338, abs=1e-7)
    assert softmax_scale(MOONLIGHT_16B) == pytest.approx(192 ** -0.5, rel=1e-12)
    assert softmax_scale(TINY) == pytest.approx(128 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)
    # MindSpeed's 1/sqrt(128) is 53% below the right DSV3 scale; the tiny model keeps a >= 30% gap.
    assert softmax_scale(DEEPSEEK_V3) / wrong_scales(DEEPSEEK_V3)["v_head_dim"] == pytest.approx(1.53, abs=0.01)
    assert softmax_scale(TINY) / wrong_scales(TINY)["v_head_dim"] - 1 >= 0.30


def test_check_scale_names_the_bug():
    bad = check_scale("x", DEEPSEEK_V3, 128 ** -0.5)
    assert not bad.ok and bad.bug == "v_head_dim" and "0.0883883" in bad.message() and "0.1352338" in bad.message()
    assert check_scale("x", DEEPSEEK_V3, 0.1352337788608801).ok
    # MindSpeed v2.2.0 with mbridge's kv_channels = head_dim = qk_rope_head_dim = 64: named, not "unknown"
    rope = check_scale("x", DEEPSEEK_V3, 0.125)
    assert not rope.ok and rope.bug == "qk_rope_head_dim" and "(= the qk_rope_head_dim bug)" in rope.message()
    assert check_scale("x", DEEPSEEK_V3, 0.11).bug is None


def test_derived_weights_are_views_with_vllm_layout(weights):
    kv = weights[0]["model.layers.0.self_attn.kv_b_proj.weight"]
    w_uk_t, w_uv = derive_absorbed(kv, SPEC)
    n, p, v, lat = SPEC.num_attention_heads, SPEC.qk_nope_head_dim, SPEC.v_head_dim, SPEC.kv_lora_rank
    assert w_uk_t.shape == (n, p, lat) and w_uv.shape == (n, lat, v)
    assert w_uk_t.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()
    # kv_b_proj rows per head are [k_nope (P) | v (V)]: W_UV[h, l, j] = kv[h*(P+V) + P + j, l]
    assert w_uv[1, 7, 3] == kv[1 * (p + v) + p + 3, 7] and w_uk_t[2, 5, 9] == kv[2 * (p + v) + 5, 9]
    with pytest.raises(ValueError, match="does not match"):
        derive_absorbed(torch.empty(0), SPEC)


@pytest.mark.parametrize("fault", [None, EngineFault.STALE_COPY, EngineFault.DTYPE_COPY, EngineFault.REBIND])
def test_freshness_and_behaviour_fail_only_on_stale_engines(weights, fault):
    old, new = weights
    fresh = ReferenceEngine(SPEC, new).generate(PROMPTS, 5)
    engine = ReferenceEngine(SPEC, old, fault=fault)
    pre = engine.generate(PROMPTS, 5)
    engine.load_weights(new.items())
    report = check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32)
    behaviour = SyncBehaviour(engine.name, pre, engine.generate(PROMPTS, 5), fresh)
    if fault is None:
        assert report.ok and behaviour.ok, (report.message(), behaviour.message())
        return
    assert not report.ok and {(d.layer, d.weight) for d in report.stale} == {
        (i, w) for i in range(SPEC.num_hidden_layers) for w in ("W_UK_T", "W_UV")}
    assert "layer 0 W_UK_T" in report.message() and "worst |diff|" in report.message()
    # Stale absorbed weights only corrupt decode: the first generated token comes from prefill.
    assert not behaviour.ok and "decode" in behaviour.message()
    assert [t[0] for t in behaviour.post] == [t[0] for t in fresh]


def test_behaviour_sensitivity_guard():
    same = [[1, 2, 3]]
    finding = SyncBehaviour("e", pre=same, post=same, fresh=same)
    assert not finding.ok and "changed nothing" in finding.message()


def test_aliasing_probe_tells_views_from_copies(weights):
    views = probe_aliasing(ReferenceEngine(SPEC, weights[0]).mla_layers(), SPEC)
    copies = probe_aliasing(ReferenceEngine(SPEC, weights[0], fault="stale_copy").mla_layers(), SPEC)
    assert views and all(a.shares_storage and a.propagates for a in views)
    assert copies and not any(a.shares_storage or a.propagates for a in copies)


def test_freshness_reports_a_dropped_kv_b_proj():
    # AMX_MLA replaces kv_b_proj.weight by an empty tensor after packing its own copies.
    from harness.engines.base import MLALayer

    w = torch.zeros(SPEC.num_attention_heads, SPEC.qk_nope_head_dim, SPEC.kv_lora_rank)
    report = check_freshness("amx", [MLALayer(0, torch.empty(0), w, None)], SPEC, torch.float32)
    assert not report.ok and "layer 0" in report.message() and "dropped" in report.message()


def test_compare_logprobs_locates_worst():
    a = [torch.zeros(3, 4)]
    b = [torch.zeros(3, 4)]
    b[0][2, 1] = 0.5
    found = compare_logprobs("x", a, b, torch.float32)
    assert not found.ok and found.count == 1 and found.where == (0, 2, 1) and found.worst == pytest.approx(0.5)
    assert compare_logprobs("x", a, a, torch.float32).ok


def test_comparators_follow_assert_close():
    """A finite value against a -inf reference is a mismatch (it used to pass: the threshold became
    inf); -inf matches -inf, NaN matches nothing; worst/where are over the mismatches only."""
    want = torch.tensor([[0.0, float("-inf"), -1.0, -2.0]])
    got = torch.tensor([[0.0, -30.0, -1.0, -2.0]])
    found = compare_logprobs("x", [got], [want], torch.float32)
    assert found.count == 1 and found.where == (0, 0, 1) and found.worst == float("inf")
    assert compare_logprobs("x", [want], [want], torch.float32).ok
    nan = torch.tensor([[float("nan"), 0.0]])
    assert compare_logprobs("x", [nan], [nan], torch.float32).count == 1
    # a large tolerated difference (rtol * |-100|) does not hide the real, smaller mismatch at step 0
    want = torch.tensor([[-1.0, -100.0], [-1.0, -1.0]])
    got = torch.tensor([[-1.05, -100.009], [-1.0, -1.0]])
    found = compare_logprobs("x", [got], [want], torch.float32)
    assert found.count == 1 and found.where == (0, 0, 0) and found.worst == pytest.approx(0.05)
    # weights: the same rules
    from harness.mla.checks import WEIGHT_TOL, _deviation

    exp = torch.tensor([1000.0, float("inf"), 0.0])
    dev = _deviation(0, "W_UV", torch.tensor([1000.001, 3.0, 1e-3]), exp, WEIGHT_TOL[torch.float32])
    assert dev.count == 2 and dev.where == (1,) and dev.worst == float("inf")


def test_sampling_is_seeded_and_reports_logprobs(weights):
    engine = ReferenceEngine(SPEC, weights[0])
    a = engine.sample(PROMPTS, 6, temperature=1.0, seed=7)
    assert a.token_ids == engine.sample(PROMPTS, 6, temperature=1.0, seed=7).token_ids
    assert all(len(lp) == 6 and all(x <= 0 for x in lp) for lp in a.logprobs)
    greedy = engine.sample(PROMPTS, 6, full_logprobs=True)
    for toks, lps, dist in zip(greedy.token_ids, greedy.logprobs, greedy.dist_logprobs, strict=True):
        assert toks == dist.argmax(-1).tolist() and lps == pytest.approx(dist.max(-1).values.tolist())


def test_sleep_level_2_discards_weights_until_synced(weights):
    engine = ReferenceEngine(SPEC, weights[0])
    want = engine.generate(PROMPTS, 4)
    engine.sleep(level=2)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS, 4)
    engine.wake_up()
    engine.load_weights(weights[0].items())
    assert engine.generate(PROMPTS, 4) == want


@pytest.mark.parametrize("target, words", [("nocolon", "MODULE:FACTORY"), ("no_such_mod_xyz:f", "cannot import"),
                                           ("harness.mla:no_such_factory", "no callable")])
def test_engine_option_bad_input(target, words):
    with pytest.raises(BadInput, match=words):
        load_factory(target)


def test_reference_engine_bad_input(weights):
    with pytest.raises(BadInput, match="lack"):
        ReferenceEngine(SPEC, {"lm_head.weight": weights[0]["lm_head.weight"]})
    with pytest.raises(BadInput, match="unknown weight"):
        ReferenceEngine(SPEC, weights[0]).load_weights([("model.nope.weight", torch.zeros(1))])


def _compare_csv(path, rows):
    import csv

    cols = ["NPU Name", "Max diff", "NPU max", "NPU min", "NPU mean", "Bench max", "Bench min", "Bench mean",
            "Result", "NPU_Stack_Info"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for name, result, stack in rows:
            w.writerow({"NPU Name": name, "Result": result, "NPU_Stack_Info": stack, "Max diff": "0.04"})
    return path


def test_first_not_pass_names_op_and_its_stack(tmp_path):
    from harness.mla import localize

    stack = "['File /x/harness/engines/reference.py, line 235, in _attn_prefill, \\n scores = ...']"
    bad = _compare_csv(tmp_path / "bad.csv", [("Tensor.pow.0.forward.input.0", "pass", "['File a']"),
                                              ("Tensor.__mul__.15.forward.input.0", "pass", stack),
                                              ("Tensor.__mul__.15.forward.input.1", "error", "N/A"),
                                              ("Functional.linear.9.forward.output.0", "warning", "N/A")])
    verdict = localize.first_not_pass(bad)
    assert verdict.name == "Tensor.__mul__.15.forward.input.1" and "_attn_prefill" in verdict.describe()
    ok = _compare_csv(tmp_path / "ok.csv", [("Tensor.pow.0.forward.input.0", "pass", "")])
    assert localize.first_not_pass(ok) is None
    with pytest.raises(BadInput, match="cannot read"):
        localize.first_not_pass(tmp_path / "missing.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(BadInput, match="Result"):
        localize.first_not_pass(tmp_path / "other.csv")


def _rollout(engine):
    return engine.sample(PROMPTS, 5, full_logprobs=True)


@pytest.mark.parametrize("rel", [1e-2, 1e-3, 1e-4])
def test_small_updates_need_logprobs(weights, rel):
    """A kernel copy the engine does not show in mla_layers() stays at the pre-sync weights. After
    an RL-sized update greedy tokens match an engine built fresh on the new weights; only log-probs tell."""
    from harness.mla.sync import rl_update, sync

    base = weights[1]
    target = rl_update(base, rel, seed=0)
    fresh = _rollout(ReferenceEngine(SPEC, target))
    for fault, stale in ((None, False), (EngineFault.HIDDEN_COPY, True)):
        engine = ReferenceEngine(SPEC, base, fault=fault)
        pre = _rollout(engine)
        sync(engine, target)
        post = _rollout(engine)
        assert check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32).ok  # views: look fresh
        tokens_only = SyncBehaviour(engine.name, pre.token_ids, post.token_ids, fresh.token_ids)
        full = SyncBehaviour.of_rollouts(engine.name, pre, post, fresh, torch.float32)
        assert tokens_only.matches_fresh  # what the token-only check saw
        assert full.changed  # sensitivity: the update itself is visible in log-probs
        assert full.ok != stale, full.message()
        if stale:
            assert "greedy tokens match" in full.message() and "log-probs outside" in full.message()


@pytest.mark.parametrize("fault", [EngineFault.REDERIVE_ONCE, EngineFault.TWO_PASS])
def test_one_sync_from_a_list_hides_what_verl_style_syncs_show(weights, fault):
    """One sync from a reusable list passes these engines; repeated syncs from one-shot
    generators in buckets (harness.mla.sync) catch them, diagnosed stale."""
    from harness.mla.sync import sync

    old, new = weights
    engine = ReferenceEngine(SPEC, old, fault=fault)
    engine.load_weights(list(new.items()))
    assert check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32).ok
    engine = ReferenceEngine(SPEC, old, fault=fault)
    history = [{i: old[f"model.layers.{i}.self_attn.kv_b_proj.weight"] for i in range(SPEC.num_hidden_layers)}]
    reports = []
    for target in (new, old, new):
        sync(engine, target)
        reports.append(check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32, previous=history))
        history.append({i: target[f"model.layers.{i}.self_attn.kv_b_proj.weight"]
                        for i in range(SPEC.num_hidden_layers)})
    bad = [r for r in reports if not r.ok]
    assert bad and all(d.cause == "stale" for r in bad for d in r.stale), [r.message() for r in bad]


@pytest.mark.parametrize("fault, cause", [(EngineFault.PRECISION, "precision loss"), (EngineFault.LAYOUT, "layout"),
                                          (EngineFault.STALE_COPY, "stale")])
def test_freshness_diagnosis_from_evidence(weights, fault, cause):
    """The cause is what the evidence matches, not a fixed blame."""
    old, new = weights
    engine = ReferenceEngine(SPEC, old, fault=fault)
    engine.load_weights(new.items())
    history = [{i: old[f"model.layers.{i}.self_attn.kv_b_proj.weight"] for i in range(SPEC.num_hidden_layers)}]
    report = check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32, previous=history)
    assert not report.ok and {d.cause for d in report.stale} == {cause}, report.message()
    assert f"-> {cause}" in report.message()
    # without the earlier state as evidence, a stale copy is not called stale
    if cause == "stale":
        assert {d.cause for d in check_freshness("x", engine.mla_layers(), SPEC, torch.float32).stale} == {"unknown"}


def test_weight_integrity_names_the_dropped_weight(weights):
    from harness.mla.checks import check_integrity

    old, new = weights
    for fault in (None, EngineFault.DROP_KV_A):
        engine = ReferenceEngine(SPEC, old, fault=fault)
        engine.load_weights(new.items())
        report = check_integrity(engine.name, engine.synced_weights(), new, torch.float32)
        assert report.checked == len(new) and report.ok == (fault is None), report.message()
    assert {name for name, *_ in report.off} == {f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight"
                                                 for i in range(SPEC.num_hidden_layers)}
    empty = check_integrity("x", {}, new, torch.float32)
    assert not empty.ok and "exposes none" in empty.message()


def test_buckets_split_layers_and_are_one_shot(weights):
    from harness.mla.sync import buckets, one_shot, split_layers

    parts = buckets(weights[0], 3)
    assert len(parts) == 3 and sum(map(len, parts)) == len(weights[0]) and split_layers(parts)
    gen = one_shot(parts[0])
    assert len(list(gen)) == len(parts[0]) and list(gen) == []
