"""The sending side of the weight sync, for real: Megatron with PP 2 and EP 2 (or TP 2) on four gloo ranks, exported
by verl 0.9.1's `per_tensor_generator` or mbridge's DeepseekV3 bridge, sent through verl's bucketed transfer, into
the engine under test (harness.launch.megatron_sender says what runs and what stands in for CUDA-only pieces).

Every other weight-sync suite starts from a state dict, so the sender -- where the bugs users report now live
(verl#7086 stale EP maps, NovaSky-AI/SkyRL#1345 stale PP metadata with PP > 1) -- never runs there. Here the
engine is built dummy (verl's load_format=dummy), takes sync 1, sleeps at level 2 and wakes where it supports sleep
mode, takes sync 2 (every tensor different): after each, the stream equals the trainer's weights tensor for tensor,
greedy tokens and full log-probs equal an engine built fresh on them, W_UK_T / W_UV are the derivation of the new
kv_b_proj, and every exposed weight -- experts and router bias included -- is the trainer's. The phases of each
sync (export, transfer, load, finalize) go to the report (`sync.phases`). Under `--platform-stub npu` the sender's
ranks run under a stub of verl's Ascend platform (harness.engines.verl_npu_stub), as on an NPU host.

The four ranks are one process for the session (fixtures.engines `megatron_sender`; issue 43: starting them was
most of each case's time): each case still asks it for its own series, from a Megatron model built fresh for the
case, into an engine of its own built dummy.
"""
import pytest

from fixtures.engines import MAX_TOKENS, PROMPTS, SENDER_SPEC
from harness.markers import requires

pytestmark = [pytest.mark.tiny, requires(packages=["megatron.core", "mbridge", "verl", "zmq"])]

SENDERS = [("verl", "tp1-pp2-ep2"), ("mbridge", "tp1-pp2-ep2"), ("verl", "tp2-pp2-ep1"), ("mbridge", "tp2-pp2-ep1")]


@pytest.mark.syncs_weights
@pytest.mark.parametrize("exporter, layout", SENDERS, ids=[f"{e}-{lay}" for e, lay in SENDERS])
def test_megatron_sender_syncs_reach_the_engine(engine_kind, engine_dtype, exporter, layout, sender_weights,
                                                sender_model_dirs, sender_goldens, detected_hardware,
                                                megatron_sender, record_property, expect):
    from harness.launch.megatron_sender import SenderRun, run_series

    with engine_kind.make(SENDER_SPEC, weights=None, load_format="dummy", dtype=engine_dtype, seed=0) as engine, \
            SenderRun(sender_model_dirs, exporter=exporter, layout=layout, server=megatron_sender) as sender:
        series = run_series(engine, sender, sender_weights, [g.rollout for g in sender_goldens], prompts=PROMPTS,
                            max_tokens=MAX_TOKENS)
    record_property("sync.phases", {"platform": detected_hardware.kind, "engine": engine.name,
                                    "exporter": exporter, "layout": layout, "syncs": series.phases(sender)})
    record_property("sync.megatron_sender", series.log)
    expect(*series.results)
