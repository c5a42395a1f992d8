"""Self-tests of the reference engine's sleep mode (harness/engines/reference.py `sleep` / `wake_up`), on the
engine's own tensors (the RSS measurement is tests/test_memory_sleep.py and the memory suite): storage is really
freed while asleep, W_UK_T / W_UV stay views of kv_b_proj across a wake-up, level 1 restores the weights
bit for bit, level 2 comes back empty until the weight sync, and the fault engines keep their bugs (seed 001)."""
from __future__ import annotations

import pytest
import torch

from harness.config.models import TINY
from harness.engines.reference import EngineFault, ReferenceEngine
from harness.engines.weights import random_state_dict
from harness.mla.checks import check_freshness, probe_aliasing

SPEC = TINY.with_layers(2, first_k_dense_replace=2, name="tiny-dsv3-2l-dense")
PROMPTS = [[5, 9, 13, 2], [77, 1]]


@pytest.fixture(scope="module")
def weights():
    return random_state_dict(SPEC, seed=0), random_state_dict(SPEC, seed=1)


def _absorbed(engine):
    return [w for layer in engine.mla_layers() for w in (layer.w_uk_t, layer.w_uv)]


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_every_weight_storage(weights, level):
    engine = ReferenceEngine(SPEC, weights[0])
    assert engine.supports_sleep
    layers = engine.mla_layers()
    engine.sleep(level=level)
    held = [name for name, p in engine.params.items() if p.untyped_storage().nbytes()]
    held += [f"layer {x.layer} absorbed" for x in layers if x.w_uv.untyped_storage().nbytes()]
    assert not held, f"{len(held)} weight storages still allocated while asleep, first {held[0]}"
    engine.wake_up()


@pytest.mark.parametrize("level", [1, 2])
def test_wake_up_keeps_absorbed_views_of_kv_b_proj(weights, level):
    # The engine derives W_UK_T / W_UV once; after a wake-up they must still alias kv_b_proj, or the next
    # sync leaves them stale (the bug of seed 001, here caused by reallocation instead of a copy).
    engine = ReferenceEngine(SPEC, weights[0])
    engine.sleep(level=level)
    engine.wake_up()
    engine.load_weights(weights[1].items())
    report = check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32)
    assert report.ok, report.message()
    assert all(a.shares_storage and a.propagates for a in probe_aliasing(engine.mla_layers(), SPEC))


def test_level_1_restores_weights_bit_for_bit(weights):
    engine = ReferenceEngine(SPEC, weights[0])
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    want = engine.generate(PROMPTS, 6)
    engine.sleep(level=1)
    engine.wake_up()
    changed = [k for k, v in engine.state_dict().items() if not torch.equal(v, before[k])]
    assert not changed, f"{len(changed)} weights differ after sleep(1) -> wake_up, first {changed[0]}"
    assert engine.generate(PROMPTS, 6) == want


def test_level_2_wakes_empty_until_synced(weights):
    engine = ReferenceEngine(SPEC, weights[0])
    want = engine.generate(PROMPTS, 6)
    engine.sleep(level=2)
    engine.wake_up()
    assert all(not v.any() for v in engine.state_dict().values()), "level 2 must discard the weights"
    engine.load_weights(weights[0].items())
    assert engine.generate(PROMPTS, 6) == want


@pytest.mark.parametrize("fault", [EngineFault.STALE_COPY, EngineFault.DTYPE_COPY, EngineFault.REBIND])
@pytest.mark.parametrize("level", [1, 2])
def test_fault_engines_stay_stale_across_sleep(weights, fault, level):
    # Level 1 offloads the stale copies with the weights (still the initial values); level 2 discards them
    # with the pool as vLLM does, and nothing re-derives them: stale (zero) after the sync either way.
    engine = ReferenceEngine(SPEC, weights[0], fault=fault)
    engine.load_weights(weights[0].items())  # REBIND: the views now hold the orphaned old storage
    initial = [w.clone() for w in _absorbed(engine)]
    engine.sleep(level=level)
    engine.wake_up()
    engine.load_weights(weights[1].items())
    report = check_freshness(engine.name, engine.mla_layers(), SPEC, torch.float32)
    assert not report.ok, f"{fault.value} after sleep({level}): the seeded staleness disappeared"
    expected = initial if level == 1 else [torch.zeros_like(w) for w in initial]
    assert all(torch.equal(w, e) for w, e in zip(_absorbed(engine), expected, strict=True))


def test_asleep_engine_refuses_use(weights):
    engine = ReferenceEngine(SPEC, weights[0])
    with pytest.raises(ValueError, match="sleep level 3"):
        engine.sleep(level=3)
    engine.sleep(level=2)
    for call in (lambda: engine.generate(PROMPTS, 2), lambda: engine.load_weights(weights[0].items()),
                 engine.state_dict, lambda: engine.sleep(level=1)):
        with pytest.raises(RuntimeError, match="asleep"):
            call()
    engine.wake_up()
    engine.wake_up()  # awake already: nothing to do
    engine.load_weights(weights[0].items())
    assert len(engine.generate(PROMPTS, 2)[0]) == 2
