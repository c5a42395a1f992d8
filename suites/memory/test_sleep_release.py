"""Sleep mode returns rollout memory (seed 001): between rollout and training verl puts vLLM to sleep;
level 1 offloads the weights and drops the KV cache, level 2 drops both. Seed 001 had to prove with
profiling that memory really came back (the OOMs were long garbled responses, not a leak), and found
that vllm-ascend frees through aclrtFreePhysical, which torch's allocator statistics never see; so the
measurement is device-level (mem_get_info) on NPU/GPU, and the process's resident memory on CPU.

Runs over the engines under test (`engine_kind`: reference, vllm, or `--engine`). vLLM CPU 0.32 has no
sleep mode (its CPU worker logs "sleep mode is not supported on CPU" and keeps everything), so on CPU
the vLLM cases skip and the reference engine is measured: it frees its weights' storage for real (level 1
offloads them to a temporary file, level 2 discards them; harness/engines/reference.py `sleep`).
A sleep that releases memory must also wake up right: level 1 restores the weights, level 2 needs the
next weight sync, after which generation must match what it was before sleep.
"""
from __future__ import annotations

import pytest
import torch

from fixtures.engines import MAX_TOKENS, MLA_SPEC, PROMPTS
from harness.memory.device import check_sleep_release, torch_allocated_bytes, used_bytes

# 24 dense layers of the tiny model: ~69 MiB of fp32 weights, well above RSS noise (16 MiB atol) on CPU.
SLEEP_SPEC = MLA_SPEC.with_layers(24, first_k_dense_replace=24, name="tiny-dsv3-24l")


@pytest.fixture
def sleep_device(detected_hardware) -> str:
    """The device type an engine's memory lives on here: npu, cuda, or cpu."""
    return {"npu": "npu", "gpu": "cuda"}.get(detected_hardware.kind, "cpu")


@pytest.mark.tiny
@pytest.mark.parametrize("level", [1, 2])
def test_sleep_returns_memory_to_preload_level(engine_kind, sleep_device, level, record_property, expect):
    if engine_kind.name.startswith("vllm") and sleep_device == "cpu":
        # harness.engines.vllm enables sleep mode only on GPU/NPU; skip before a 30 s engine start.
        pytest.skip("vLLM CPU 0.32 has no sleep mode (cpu_worker.sleep: 'sleep mode is not supported on CPU')")
    baseline = used_bytes(sleep_device)
    with engine_kind.make(SLEEP_SPEC, weights=None, load_format="dummy", dtype=torch.float32, seed=0) as engine:
        if not engine.supports_sleep:
            pytest.skip(f"{engine.name} has no sleep mode on {sleep_device} (vLLM CPU ignores sleep)")
        # vLLM allocates its weights and the whole KV pool at init: no rollout needed to be "loaded"
        loaded, torch_loaded = used_bytes(sleep_device), torch_allocated_bytes(sleep_device)
        engine.sleep(level=level)
        asleep, torch_asleep = used_bytes(sleep_device), torch_allocated_bytes(sleep_device)
        verdict = check_sleep_release(engine.name, sleep_device, baseline, loaded, asleep)
        record_property("memory.sleep", {
            "engine": engine.name, "device": sleep_device, "level": level, "baseline_bytes": baseline,
            "loaded_bytes": loaded, "asleep_bytes": asleep, "torch_allocated_loaded": torch_loaded,
            "torch_allocated_asleep": torch_asleep, "released": verdict.ok})
        engine.wake_up()
    expect(verdict)


@pytest.mark.tiny
@pytest.mark.parametrize("level", [1, 2])
def test_wake_up_generates_as_before_sleep(engine_kind, sleep_device, level, mla_spec, mla_weights, mla_model_dirs):
    # verl's rollout loop: sleep after rollout, wake_up before the next one; after level 2 the weights come
    # back only through the weight sync (load_weights). A wake path that loses or garbles weights (or
    # absorbed W_UK_T / W_UV copies discarded with the pool and never re-derived) changes the tokens.
    if engine_kind.name.startswith("vllm") and sleep_device == "cpu":
        pytest.skip("vLLM CPU 0.32 has no sleep mode (cpu_worker.sleep: 'sleep mode is not supported on CPU')")
    with engine_kind.make(mla_spec, weights=mla_model_dirs[0], load_format="real", dtype=torch.float32,
                          seed=0) as engine:
        if not engine.supports_sleep:
            pytest.skip(f"{engine.name} has no sleep mode on {sleep_device}")
        before = engine.generate(PROMPTS, MAX_TOKENS)
        engine.sleep(level=level)
        engine.wake_up()
        if level == 2:
            engine.load_weights(mla_weights[0].items())
        after = engine.generate(PROMPTS, MAX_TOKENS)
    diff = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert not diff, (f"{engine.name}: after sleep(level={level}) -> wake_up{' -> load_weights' * (level == 2)}, "
                      f"{len(diff)}/{len(before)} prompts generate differently, first prompt {diff[0]}: "
                      f"{before[diff[0]]} -> {after[diff[0]]}")
