"""Per-phase memory plans at real 671B shapes (analytic, seconds on CPU): every registered scale's
DAPO phases (rollout, prefill, old_log_prob, ref_log_prob, update) fit their device with the scale's
headroom, except the expected finding of seed 001: 2k prompts -> 12k garbled responses
(full-a2-gbs32), whose actor logits do not fit; the verdict must say so and name the knobs.
"""
from __future__ import annotations

import pytest

from harness.config.scales import SCALES
from harness.memory.job_options import scale_options
from harness.memory.phases import plan_memory

LOGITS_OOM_SCALE = "full-a2-gbs32"


@pytest.mark.layer
@pytest.mark.cpu
@pytest.mark.parametrize("name", [n for n in SCALES if n != LOGITS_OOM_SCALE])
def test_every_phase_fits_with_headroom(name, record_property, expect):
    results = plan_memory(SCALES[name], scale_options(SCALES[name]))  # the scale's job as `plan` emits it
    record_property("memory.phases", [p.to_json() for p in results])
    expect(*results)


@pytest.mark.layer
@pytest.mark.cpu
def test_2k_to_12k_flags_the_logits_oom_and_names_the_knob(record_property):
    # seed 001's engine held the full vocabulary's logits on every rank (verl 0.9.1's Megatron actor shards them by TP:
    # harness.memory.phases MemoryOptions.vocab_parallel_logits)
    scale = SCALES[LOGITS_OOM_SCALE]
    results = plan_memory(scale, scale_options(scale, vocab_parallel_logits=False))
    record_property("memory.phases", [p.to_json() for p in results])
    update = next(p for p in results if p.phase == "update")
    assert not update.fits, f"expected the 2k->12k update not to fit; model says {update.peak_gib:.2f} GiB fits"
    assert update.largest == "logits", update.to_json()
    advice = " ".join(update.notes)
    for knob in ("context parallel", "micro batch", "max response length"):
        assert knob in advice, f"verdict does not name {knob!r}: {advice!r}"
    assert all(p.fits for p in results if p.phase in ("rollout", "prefill")), "the rollout side fits in seed 001"
