"""Self-tests of the phase model (harness.perf): it reproduces seed 002's published A3 breakdown (each phase within
20 %, TPS/card within 10 %), its stored constants are the ones the breakdown gives, a seeded wrong constant or wrong
physics fails the reproduction and names the phase, and the out-of-calibration errors stay what the model states.
Pure arithmetic over the memory model: well under a second."""
from __future__ import annotations

import dataclasses

import pytest

from harness.config.scales import SCALES
from harness.errors import BadInput
from harness.perf.model import CALIBRATION, PHASES, Features, predict
from harness.perf.published import (
    CALIBRATION_CASE,
    PHASE_RTOL,
    RANDOM_WEIGHTS_CASE,
    RECOMPUTE8_CASE,
    SEED002_FEATURES,
    TPS_RTOL,
    derive_calibration,
    reproduce,
)
from harness.perf.whatif import KNOBS, sweep, what_if


def test_reproduces_seed002_breakdown():
    r = reproduce(CALIBRATION_CASE)
    assert r.passed, r.failures
    for phase, published in CALIBRATION_CASE.phases.items():
        got = r.prediction.phase(phase)
        assert got == pytest.approx(published, rel=PHASE_RTOL, abs=1.0), phase
    assert r.prediction.tps_per_card == pytest.approx(123.16, rel=TPS_RTOL)
    assert r.prediction.step_s == pytest.approx(859.68, rel=0.02)
    assert set(CALIBRATION_CASE.phases) == set(PHASES)  # every modelled phase is judged, none left out


def test_stored_constants_are_the_derived_ones():
    """CALIBRATION holds the breakdown's inversion rounded: a formula changed without re-deriving fails here."""
    derived = derive_calibration()
    for field in dataclasses.fields(CALIBRATION):
        stored, fit = getattr(CALIBRATION, field.name), getattr(derived, field.name)
        assert stored == pytest.approx(fit, rel=0.01), f"{field.name}: stored {stored:g}, derived {fit:g}"


@pytest.mark.parametrize(("seed", "phase"), [
    # decode bound by compute instead of HBM bandwidth: the roofline's mistake (seed 002 sits at ~9 % of it)
    (dict(features=dataclasses.replace(SEED002_FEATURES, decode_bound="compute")), "gen"),
    # decode at the datasheet bandwidth: no MC2 latency, no host pre/post-processing
    (dict(calibration=dataclasses.replace(CALIBRATION, decode_hbm_efficiency=1.0)), "gen"),
    # one MFU for every phase: the forward-only phases are not the update's efficiency
    (dict(calibration=dataclasses.replace(CALIBRATION, forward_mfu=CALIBRATION.update_mfu)), "ref"),
    # the TensorCache assumed present: seed 002's real-weight run had Ray's serial dispatch (its footnote 1)
    (dict(features=dataclasses.replace(SEED002_FEATURES, tensor_cache=True)), "ref"),
])
def test_seeded_wrong_constant_fails_and_names_the_phase(seed, phase):
    r = reproduce(CALIBRATION_CASE, **seed)
    assert not r.passed
    assert any(f.startswith(f"{phase}:") for f in r.failures), r.failures


def test_out_of_calibration_recompute8():
    """Not calibrated on: recompute 8 layers, published 112 TPS/card at first (120+ after ~13 steps)."""
    r = reproduce(RECOMPUTE8_CASE)
    assert abs(r.tps_error) < 0.10, r.tps_error
    assert 112.0 < r.prediction.tps_per_card < 125.0
    assert r.prediction.phase("update_actor") > reproduce(CALIBRATION_CASE).prediction.phase("update_actor")


def test_out_of_calibration_random_weights_errors_are_the_stated_ones():
    """The published random-weight peak run: gen and reshard transfer, the training phases do not (forced expert
    balance is outside the calibration). The model's TRUST text states these; a change that moves them must
    restate it."""
    r = reproduce(RANDOM_WEIGHTS_CASE)
    assert abs(r.errors["gen"]) < 0.10 and abs(r.errors["update_weights"]) < 0.10
    assert r.errors["ref"] > 0.5 and r.errors["update_actor"] > 0.3
    assert -0.40 < r.tps_error < -0.20
    named = {f.split(":")[0].split(" ")[0] for f in r.failures}
    assert named >= {"ref", "update_actor", "TPS/card"}, r.failures


@pytest.mark.parametrize("name", [s for s in SCALES if SCALES[s].hardware.name != "cpu"])
def test_every_accelerator_scale_is_predicted(name):
    p = predict(SCALES[name])
    assert p.step_s > 0 and 0 < p.tps_per_card < 1e4
    assert all(ph.seconds >= 0 for ph in p.phases)


def test_cpu_scale_is_refused_naming_the_scale():
    with pytest.raises(BadInput, match="--scale tiny: no phase model for hardware 'cpu'"):
        predict(SCALES["tiny"])


def test_stock_verl_computes_old_log_prob():
    """verl 0.9.1 runs old_log_prob; seed 002's patch skipped it (§5.2): the stock plan is slower by that forward."""
    stock = predict(CALIBRATION_CASE.scale, CALIBRATION_CASE.workload, Features())
    patched = predict(CALIBRATION_CASE.scale, CALIBRATION_CASE.workload, SEED002_FEATURES)
    assert stock.phase("old_log_prob") == pytest.approx(patched.phase("ref"), rel=1e-9)
    assert stock.tps_per_card < patched.tps_per_card


def test_what_if_knobs_move_the_prediction():
    scale = SCALES["full-a3"]
    recompute = sweep(scale, "recompute_layers")
    tps = [v.tps_per_card for v in recompute]
    assert tps == sorted(tps, reverse=True)  # more recompute, more FLOPs, fewer tokens per second
    doc = what_if(scale)
    assert set(doc["knobs"]) == set(KNOBS) and doc["moves_tps_most"] in KNOBS
    spans = {k: v["span"] for k, v in doc["knobs"].items()}
    assert spans[doc["moves_tps_most"]] == max(spans.values()) > 0
    with pytest.raises(BadInput, match="what-if knob"):
        sweep(scale, "gbs")


def test_eager_rollout_decodes_twice_as_long():
    """seed 002 §6.1.3: graph mode doubled decode throughput; an eager plan (enforce_eager=True) must not be
    predicted at the graph-mode speed."""
    graph = predict(CALIBRATION_CASE.scale, CALIBRATION_CASE.workload, SEED002_FEATURES)
    eager = predict(dataclasses.replace(CALIBRATION_CASE.scale, graph_mode=False), CALIBRATION_CASE.workload,
                    SEED002_FEATURES)
    assert eager.detail["decode_s"] == pytest.approx(2 * graph.detail["decode_s"])
    assert eager.phase("ref") == graph.phase("ref") and eager.tps_per_card < graph.tps_per_card


def test_trust_says_gen_is_calibrated_on_torchair():
    """Issue 46 m4: the calibration run decoded under TorchAir, which vllm-ascend removed (PR #4814, v0.12.0rc1);
    the supported stacks run ACL graph, so the TRUST text `plan` prints must say gen is uncalibrated there."""
    from harness.perf.model import TRUST

    assert "TorchAir" in TRUST and "ACL graph" in TRUST and "uncalibrated until the first nightly" in TRUST
