"""Seeded MLA bugs make the MLA suites fail with a message naming the layer or the scale; the reference passes.

Each seeded engine (tests/seeded_engines.py) is plugged in through `--engine` and the real suite files run in a
throw-away pytest session (pytester, in process), exactly as a user's engine would be.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYNC_SUITE = ROOT / "suites/functional/test_mla_weight_sync.py"
SCALE_SUITE = ROOT / "suites/precision/test_mla_softmax_scale.py"
ALIGN_SUITE = ROOT / "suites/precision/test_mla_forward_alignment.py"
SLEEP_SUITE = ROOT / "suites/memory/test_sleep_release.py"
MOE_SYNC_SUITE = ROOT / "suites/functional/test_moe_weight_sync.py"
INVARIANCE_SUITE = ROOT / "suites/consistency/test_batch_invariance.py"
MOE_ALIGN_SUITE = ROOT / "suites/precision/test_moe_forward_alignment.py"
ROUTING_SUITE = ROOT / "suites/consistency/test_routing_agreement.py"


@pytest.fixture(scope="module", autouse=True)
def _preload_heavy_modules():
    """pytester's in-process runs drop modules first imported inside them; torch and transformers must not be
    imported twice (torch refuses to re-register its operator libraries), so import them here, once."""
    import torch.distributed._functional_collectives  # noqa: F401
    from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM, GenerationMixin  # noqa: F401

    import harness.engines.reference  # noqa: F401
    import harness.engines.training  # noqa: F401


def run_suite(pytester: pytest.Pytester, suite: Path, engine: str, select: str, *args: str) -> pytest.RunResult:
    # fp32 unless the selection names a dtype: most seeded faults are fp32 bugs (a bf16 rounding is no fault in a
    # bf16 engine); a fault that only bf16 shows (a stale fp32 copy) selects bf16 itself
    dtype = "" if "bf16" in select or "fp32" in select else " and not bf16"
    return pytester.runpytest_inprocess(str(suite), "--engine", f"seeded_engines:{engine}", "-m", "tiny",
                                        "-k", f"({select}){dtype}", "-p", "no:cacheprovider",
                                        f"--rootdir={ROOT}", "-q", *args)


# (engine, suite, -k selection, failures expected, words the failure output must contain)
CASES = [
    ("stale_copy", SYNC_SUITE, "reaches_absorbed", 2, ["layer 0 W_UK_T", "layer 1 W_UV", "decode", "-> stale"]),
    ("dtype_copy", SYNC_SUITE, "reaches_absorbed", 2, ["layer 0 W_UV", "not re-derived"]),
    ("rebind", SYNC_SUITE, "reaches_absorbed", 2, ["layer 1 W_UK_T", "decode", "-> stale"]),
    # each slipped through one sync from a list with token-only behaviour
    ("rederive_once", SYNC_SUITE, "reaches_absorbed", 2, ["after sync 2/3 (old)", "-> stale"]),  # caught: many syncs
    ("two_pass", SYNC_SUITE, "reaches_absorbed", 2, ["after sync 1/3 (new)", "-> stale"]),  # caught: generator input
    ("hidden_copy", SYNC_SUITE, "reaches_absorbed", 2, ["decode differently"]),  # caught: tokens on big syncs
    ("drop_kv_a", SYNC_SUITE, "reaches_absorbed", 2, ["model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                                                      "dropped or mis-mapped"]),  # caught: every weight checked
    ("precision", SYNC_SUITE, "reaches_absorbed", 2, ["-> precision loss"]),  # caught: diagnosis from evidence
    ("layout", SYNC_SUITE, "reaches_absorbed", 2, ["-> layout", "[nope | v] split"]),  # caught: diagnosis from evidence
    ("scale_v_head", SCALE_SUITE, "closed_form or right_scale", 4, ["softmax scale 0.1250000", "v_head_dim bug",
                                                                    "0.1656269"]),
    ("scale_no_mscale", SCALE_SUITE, "closed_form or right_scale", 3,
     ["no_mscale bug", "softmax scale 0.0883883", "tiny-dsv3-dense"]),
    # sleep level 2 discards the copies; syncs after wake_up must re-derive them every time
    ("rederive_once", SLEEP_SUITE, "wake", 1, ["sleep(level=2) -> wake_up -> sync", "generate differently"]),
    ("two_pass", SLEEP_SUITE, "wake", 1, ["step 1 (sleep(level=2)"]),
    ("decode_scale", SCALE_SUITE, "closed_form or right_scale", 1,  # softmax_scale() is right, decode not
     ["behavioural scale check failed", "reports 0.1656269: the closed form", "decode steps",
      "not identified as a scale bug"]),
    ("scale_v_head", ALIGN_SUITE, "match_training", 1, ["log-probs outside", "decode steps"]),
    # MoE: invisible to the all-dense MLA model; the MoE sync suite must catch both
    ("packed_experts", MOE_SYNC_SUITE, "reaches_moe and real", 1, ["after sync 1/2 (new)", "decode differently"]),
    ("stale_router_bias", MOE_SYNC_SUITE, "reaches_moe and real", 1, ["model.layers.3.mlp.gate.e_score_correction_bias",
                                                             "dropped or mis-mapped"]),
    # MoE routing (issue 31): invisible to the all-dense MLA alignment; caught by the MoE forward alignment
    ("plain_topk", MOE_ALIGN_SUITE, "match_training", 1, ["MoE rollout vs transformers DeepseekV3",
                                                          "steps outside, 0 allowed"]),
    ("biased_weights", MOE_ALIGN_SUITE, "match_training", 1, ["MoE rollout vs transformers DeepseekV3",
                                                              "log-probs outside"]),
    # the routing suite runs the --engine engine too (it built vLLM directly before): its routes are judged
    ("plain_topk", ROUTING_SUITE, "trainer_routes", 1, ["first flips at a wide margin"]),
    # MoE sync (issue 31): a real fp32 sync cannot show either; bf16 shows the stale router copy, dummy the experts
    ("stale_router_fp32", MOE_SYNC_SUITE, "reaches_moe and bf16 and real", 1, ["after sync 1/2 (new)",
                                                                              "decode differently"]),
    ("dummy_experts", MOE_SYNC_SUITE, "reaches_moe and dummy", 1, ["model.layers.3.mlp.experts.",
                                                                   "dropped or mis-mapped"]),
    # claims batch invariance, split-K linear split by the batch size: caught where the batch changes
    ("split_k", INVARIANCE_SUITE, "batched", 1, ["claims batch invariance, but",
                                                 "log-prob bits first differ at position 0"]),
]


@pytest.mark.parametrize("engine, suite, select, n_failed, words", CASES,
                         ids=[f"{c[0]}-{c[1].stem}" for c in CASES])
def test_seeded_engine_fails_suite(pytester, engine, suite, select, n_failed, words):
    result = run_suite(pytester, suite, engine, select)
    outcomes = result.parseoutcomes()
    out = result.stdout.str()
    assert outcomes.get("failed", 0) == n_failed, f"{outcomes}\n{out[-3000:]}"
    for word in words:
        assert word in out, f"{word!r} not in the failure output:\n{out[-3000:]}"


@pytest.mark.parametrize("suite, select, engine", [(SYNC_SUITE, "reaches_absorbed", "correct"),
                                                   (SLEEP_SUITE, "wake", "correct"),
                                                   (SCALE_SUITE, "closed_form or right_scale", "correct"),
                                                   (ALIGN_SUITE, "match_training", "correct"),
                                                   (MOE_SYNC_SUITE, "reaches_moe", "correct"),
                                                   (MOE_ALIGN_SUITE, "match_training", "correct"),
                                                   (ROUTING_SUITE, "well_formed or trainer_routes", "correct"),
                                                   (INVARIANCE_SUITE, "bit_equal or batched", "batch_invariant"),
                                                   # deterministic, batch-variant: its determinism verdict passes
                                                   (INVARIANCE_SUITE, "bit_equal", "split_k")],
                         ids=lambda v: v.stem if isinstance(v, Path) else None)
def test_reference_engine_passes_suite(pytester, suite, select, engine):
    result = run_suite(pytester, suite, engine, select)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) > 0, result.stdout.str()[-3000:]


def test_no_claim_passes_under_strict_hardware(pytester):
    """The nightly passes --strict-hardware; an engine that claims no batch invariance on a platform without a
    batch-invariant mode (vLLM CPU; here the plain reference engine) is recorded and passes. Seeded: the suite once
    skip-or-failed there, which under --strict-hardware failed every night by design."""
    result = run_suite(pytester, INVARIANCE_SUITE, "correct", "batched", "--strict-hardware")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 1, result.stdout.str()[-3000:]


def test_the_no_claim_case_fails_the_night_with_its_fix_reverted(pytester):
    """Blocker 4 reverted: the suite's no-claim branch skip-or-fails again (as before the fix), and the nightly's
    --strict-hardware run of it fails -- the revert the test above exists to catch."""
    source = INVARIANCE_SUITE.read_text()
    anchor = '    record_property("consistency.batch_invariance.claim",'
    assert source.count(anchor) == 1, f"{INVARIANCE_SUITE}: the no-claim branch moved; update this seeded revert"
    reverted = source.replace(anchor, '    from harness.markers import skip_or_fail\n\n'
                                      '    skip_or_fail(pytestconfig, "an engine that claims batch invariance")\n'
                              + anchor)
    plugins = sorted(f"fixtures.{p.stem}" for p in (ROOT / "fixtures").glob("*.py") if not p.stem.startswith("_"))
    pytester.makeconftest(f"pytest_plugins = {plugins!r}")  # the root conftest's fixtures, for a copy outside it
    suite = pytester.makepyfile(**{f"{INVARIANCE_SUITE.stem}_reverted": reverted})  # a name of its own (xdist)
    result = run_suite(pytester, suite, "correct", "batched", "--strict-hardware")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 1 and outcomes.get("passed", 0) == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*--strict-hardware: missing an engine that claims batch invariance*"])

