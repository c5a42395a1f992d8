"""Self-tests of the analytic memory model (harness.memory.phases): it reproduces seed 001's figures,
flags a plan whose logits do not fit (seeded: the 2k -> 12k case) and names a knob that really fixes it."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.config.models import DEEPSEEK_V3
from harness.config.scales import SCALES
from harness.memory import phases as mm
from harness.memory.job_options import scale_options
from harness.memory.phases import GiB, plan_memory

SEED_TOKENS, SEED_TP = 4096, 8  # seed 001: s*b = 4096 tokens per micro batch, TP8 with SP


def gb(x: float) -> float:
    return x / GiB


def test_seed001_per_layer_activations():
    # "Dense * 3 + MoE * 58 + loss = 0.15435791 * 3 + 0.578186035 * 58 + 0.246582031 = 34.2444458 (GB)"
    dense, moe = (mm.layer_activation_bytes(DEEPSEEK_V3, i, tokens=SEED_TOKENS, tp=SEED_TP) for i in (0, 3))
    assert gb(dense) == pytest.approx(0.15435791, abs=5e-9)
    assert gb(moe) == pytest.approx(0.578186035, abs=5e-9)
    loss = mm.loss_bytes(tokens=SEED_TOKENS, vocab=DEEPSEEK_V3.vocab_size, shards=SEED_TP)
    assert gb(loss) == pytest.approx(0.246582031, abs=5e-9)
    total = mm.model_activation_bytes(DEEPSEEK_V3, tokens=SEED_TOKENS, tp=SEED_TP, full_recompute=False)
    assert gb(total) == pytest.approx(34.2444458, abs=5e-7)


def test_seed001_full_recompute():
    # "[s/TP, b, h] 0.006835938 GB + loss 0.246582031 GB = 0.253417969 GB"
    assert gb(mm.layer_input_bytes(DEEPSEEK_V3, tokens=SEED_TOKENS, tp=SEED_TP)) == pytest.approx(0.006835938, abs=5e-9)
    total = mm.model_activation_bytes(DEEPSEEK_V3, tokens=SEED_TOKENS, tp=SEED_TP, full_recompute=True)
    assert gb(total) == pytest.approx(0.253417969, abs=5e-9)


def test_seed001_logits_and_actor_total():
    # "4 x 5 x 1024 x 14 x 1024 x 128 / 1024^3 = 35GB"; "35G + 8G (HCCL) + 37G (weights) = 80G" > 64 GB.
    logits = gb(mm.loss_bytes(tokens=5 * 14 * 1024, vocab=128 * 1024))
    assert logits == 35.0
    assert logits + 8 + 37 == 80 > SCALES["full-a2-gbs32"].hardware.device_memory_gib


def test_seed001_plan_layout_and_hccl():
    scale = SCALES["full-a2-gbs32"]
    stages = [len(r) for r in mm.stage_layers(scale)]
    assert stages == [3] + [4] * 14 + [2]  # TP8 PP16 EP16: first 3, last 2, middle 4
    # seed 001: HCCL held 6-8 GB under every phase (HCCL_BUFFSIZE x communicators)
    assert 6 <= gb(mm.hccl_bytes(scale, 512)) <= 8


def test_weights_per_device_sum_to_the_model():
    # Every training stage's shard, times the ranks that hold distinct shards, adds back up to 671B.
    scale = SCALES["full-a2-gbs32"]
    t, spec = scale.plan.train, scale.model
    total = 0.0
    for stage in range(t.pp):
        dense, experts = mm.train_params(scale, stage)
        total += dense * t.tp + experts * t.ep
    replicated_attn = (spec.hidden_size * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.q_lora_rank)
                       + spec.kv_lora_rank + spec.q_lora_rank) * (t.tp - 1) * spec.num_hidden_layers
    replicated_other = (2 * spec.hidden_size * t.tp - 2 * spec.hidden_size) * spec.num_hidden_layers \
        + (spec.n_routed_experts * spec.hidden_size + spec.n_routed_experts) * (t.tp - 1) * spec.num_moe_layers
    padding = 2 * (mm.vocab_padded(spec, t.tp) - spec.vocab_size) * spec.hidden_size
    exact = spec.total_params() + replicated_attn + replicated_other + padding + spec.hidden_size * (t.tp - 1)
    assert total == pytest.approx(exact, rel=1e-9)


def test_seeded_logits_oom_is_flagged_with_its_knobs():
    # Seeded bug = the 2k -> 12k plan of seed 001 on an engine that holds full-vocabulary logits on every rank (seed
    # 001's accounting, 35 GB at [5, 14336, 131072]): the update's logits do not fit the 64 GB card. verl 0.9.1's
    # Megatron engine keeps them vocab-parallel (the default), where the same plan fits.
    scale = SCALES["full-a2-gbs32"]
    (update,) = plan_memory(scale, scale_options(scale, vocab_parallel_logits=False), phases=("update",))
    assert not update.fits and update.largest == "logits", update.to_json()
    note = " ".join(update.notes)
    for knob in ("context_parallel_size", "ppo_micro_batch_size_per_gpu", "max_response_length"):
        assert knob in note, note


@pytest.mark.parametrize("fix", ["cp", "micro_batch", "response"])
def test_each_named_knob_fixes_the_logits_oom(fix):
    scale = SCALES["full-a2-gbs32"]
    options = scale_options(scale, vocab_parallel_logits=False)  # the seeded full-vocabulary engine above
    if fix == "cp":
        train = dataclasses.replace(scale.plan.train, cp=2)
        scale = dataclasses.replace(scale, plan=dataclasses.replace(scale.plan, train=train))
        scale.validate()
    elif fix == "micro_batch":
        options = dataclasses.replace(options, micro_batch=1)
    else:
        options = dataclasses.replace(options, max_response_length=8192)
    (update,) = plan_memory(scale, options, phases=("update",))
    assert update.fits, update.to_json()


def test_vanilla_prefill_oom_is_flagged_and_names_the_fix():
    scale = SCALES["full-a2-gbs128"]
    (vanilla,) = plan_memory(scale, scale_options(scale, chunked_prefill=False), phases=("prefill",))
    (chunked,) = plan_memory(scale, scale_options(scale, chunked_prefill=True), phases=("prefill",))
    assert not vanilla.fits and vanilla.largest == "activations" and "chunked prefill" in vanilla.notes[0]
    assert chunked.fits, chunked.to_json()


def test_json_record_is_serializable_with_boolean_fits():
    import json

    for p in plan_memory(SCALES["full-a3"], scale_options(SCALES["full-a3"])):
        doc = json.loads(json.dumps(p.to_json()))
        assert isinstance(doc["fits"], bool)
        assert doc["peak_gib"] == pytest.approx(sum(doc["components_gib"].values()), abs=1e-3)


@given(st.sampled_from(sorted(SCALES)), st.integers(1, 4), st.sampled_from([1024, 4096, 12288]))
def test_memory_grows_with_micro_batch_and_length(name, mb, resp):
    # Monotonicity: more tokens per micro batch never need less memory in a training phase.
    scale = SCALES[name]
    small = plan_memory(scale, scale_options(scale, micro_batch=mb, max_response_length=resp), ("update",))[0]
    big = plan_memory(scale, scale_options(scale, micro_batch=mb + 1, max_response_length=resp * 2), ("update",))[0]
    assert big.peak_gib >= small.peak_gib


def test_offload_switches_move_state_between_phases():
    scale = SCALES["full-a2-gbs128"]
    offloaded = {p.phase: p for p in plan_memory(scale, scale_options(scale))}  # the scale's job offloads
    resident = {p.phase: p for p in plan_memory(scale, scale_options(scale, param_offload=False, grad_offload=False,
                                                                     optimizer_offload=False))}
    assert "params" not in offloaded["rollout"].components and "optimizer" not in offloaded["update"].components
    # Without offload the actor's state sits under vLLM during rollout, and vLLM's KV pool shrinks to nothing.
    assert {"params", "grads", "optimizer"} <= set(resident["rollout"].components)
    # ... and vLLM cannot start: the phase fails whatever its peak (issue 44)
    assert resident["rollout"].components["kv_cache"] == 0 and "KV pool" in resident["rollout"].refused
    assert not resident["rollout"].fits
    assert resident["update"].peak_gib > offloaded["update"].peak_gib


def test_megatron_logits_are_sharded_by_tp():
    """verl 0.9.1's Megatron engine computes log-probs on vocab-parallel logits (transformer_impl.py
    `_lm_head_logits_processor` -> `vocab_parallel_log_probs_from_logits`): the logits term is 1/TP of the
    full-vocabulary one. The seeded bug (full vocabulary on each rank) put seed 002's A3 recipe at 73 GiB."""
    scale = SCALES["full-a3"]
    big = scale_options(scale, ref_micro_batch=32)  # the logits' stage (the last) is the worst one either way
    (ref,) = plan_memory(scale, big, phases=("ref_log_prob",))
    (full,) = plan_memory(scale, dataclasses.replace(big, vocab_parallel_logits=False), phases=("ref_log_prob",))
    assert ref.stage == full.stage == scale.plan.train.pp - 1
    tp = scale.plan.train.tp
    assert tp > 1 and ref.components["logits"] == pytest.approx(full.components["logits"] / tp)


def test_a_world_smaller_than_one_replica_is_one_line():
    """`plan --scale full-a3 -- trainer.nnodes=1` raised ZeroDivisionError in train_phase (dp = 0)."""
    scale = SCALES["full-a3"]
    small = dataclasses.replace(scale, devices=scale.devices_per_node, nodes=1)
    with pytest.raises(mm.BadInput, match=r"world of 16 device\(s\) .* smaller than one replica"):
        plan_memory(small, scale_options(scale))
