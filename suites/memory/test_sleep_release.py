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

from fixtures.engines import MAX_TOKENS, MLA_SPEC, PROMPTS
from harness.config.hardware import torch_device_types
from harness.config.platforms import platform_facts
from harness.markers import DETECTED_KEY, skip_or_fail
from harness.memory.device import check_sleep_release, torch_allocated_bytes, used_bytes
from harness.mla.sync import sync

# 24 dense layers of the tiny model: ~69 MiB of fp32 weights, well above RSS noise (16 MiB atol) on CPU.
SLEEP_SPEC = MLA_SPEC.with_layers(24, first_k_dense_replace=24, name="tiny-dsv3-24l")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The level verl's rollout sleeps at on this platform (harness.config.platforms: 1 on NPU, 2 on GPU); on CPU,
    # where only the reference engine sleeps, both levels.
    if "level" in metafunc.fixturenames:
        facts = platform_facts(metafunc.config.stash[DETECTED_KEY].kind)
        levels = [facts.sleep_level] if facts.sleep_level else [1, 2]
        metafunc.parametrize("level", levels, ids=[f"level{lv}" for lv in levels])


def needs_sleep(config: pytest.Config, engine) -> None:
    if not engine.supports_sleep:
        skip_or_fail(config, f"sleep mode in {engine.name} on {engine.device} (vLLM CPU 0.32 has none: "
                             "cpu_worker.sleep 'not supported on CPU')")


def vllm_on_cpu(engine_kind, detected_hardware) -> bool:
    """vLLM on CPU has no sleep mode (harness.engines.vllm enables it on GPU/NPU only): known before a 30 s start."""
    return engine_kind.name.startswith("vllm") and platform_facts(detected_hardware.kind).sleep_level is None


@pytest.mark.tiny
def test_sleep_returns_memory_to_preload_level(engine_kind, level, engine_dtype, detected_hardware, pytestconfig,
                                               record_property, expect):
    if vllm_on_cpu(engine_kind, detected_hardware):
        skip_or_fail(pytestconfig, "a GPU/NPU for vLLM's sleep mode (vLLM CPU 0.32 has none)")
    # The engine's device is known only once it exists (issue 11: the CPU reference engine on an NPU machine must
    # be measured on the CPU): take the baseline on every device type here and keep the engine's.
    baselines = {device: used_bytes(device) for device in torch_device_types(detected_hardware)}
    with engine_kind.make(SLEEP_SPEC, weights=None, load_format="dummy", dtype=engine_dtype, seed=0) as engine:
        needs_sleep(pytestconfig, engine)
        device = engine.device
        # vLLM allocates its weights and the whole KV pool at init: no rollout needed to be "loaded"
        loaded, torch_loaded = used_bytes(device), torch_allocated_bytes(device)
        engine.sleep(level=level)
        asleep, torch_asleep = used_bytes(device), torch_allocated_bytes(device)
        verdict = check_sleep_release(engine.name, device, baselines[device], loaded, asleep)
        record_property("memory.sleep", {
            "engine": engine.name, "device": device, "level": level, "baseline_bytes": baselines[device],
            "loaded_bytes": loaded, "asleep_bytes": asleep, "torch_allocated_loaded": torch_loaded,
            "torch_allocated_asleep": torch_asleep, "released": verdict.ok})
        engine.wake_up()
    expect(verdict)


@pytest.mark.tiny
def test_wake_up_generates_as_before_sleep(engine_kind, level, engine_dtype, detected_hardware, pytestconfig,
                                           mla_spec, mla_weights, mla_model_dirs):
    """verl's rollout loop, two steps of it: sleep after rollout, wake_up, sync (from one-shot generators in
    buckets, as verl does; after level 2 the weights come back only through it), roll out. Step 1 syncs `old`
    again, step 2 `new` then `old` (issue 13 pt 1: an engine that re-derives its absorbed copies on the first sync
    only passes one step). After each step the engine must generate as it did on `old` before any sleep. A wake
    path that loses or garbles weights, or copies discarded with the pool and not re-derived, changes tokens."""
    if vllm_on_cpu(engine_kind, detected_hardware):
        skip_or_fail(pytestconfig, "a GPU/NPU for vLLM's sleep mode (vLLM CPU 0.32 has none)")
    old, new = mla_weights
    failures = []
    with engine_kind.make(mla_spec, weights=mla_model_dirs[0], load_format="real", dtype=engine_dtype,
                          seed=0) as engine:
        needs_sleep(pytestconfig, engine)
        before = engine.generate(PROMPTS, MAX_TOKENS)
        for step, targets in enumerate(([old], [new, old]), 1):
            engine.sleep(level=level)
            engine.wake_up()
            for weights in targets:
                sync(engine, weights)
            after = engine.generate(PROMPTS, MAX_TOKENS)
            diff = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            if diff:
                failures.append(f"step {step} (sleep(level={level}) -> wake_up -> sync "
                                f"{' -> '.join('new' if w is new else 'old' for w in targets)}): {len(diff)}/"
                                f"{len(before)} prompts generate differently, first prompt {diff[0]}: "
                                f"{before[diff[0]]} -> {after[diff[0]]}")
    assert not failures, f"{engine.name}: " + "; ".join(failures)
