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

On GPU / NPU a process holds one sleep-mode vLLM engine (harness.config.platforms `sleep_plan`: the sleep-mode pool
never empties and the next engine's load asserts it is empty), so each vLLM case here runs in a fresh process
(harness.engines.isolation); the device-level measurement is the device's wherever it is taken.
"""
from __future__ import annotations

import functools

import pytest

from fixtures.engines import MAX_TOKENS, MLA_SPEC, MOE_SPEC, PROMPTS
from harness.config.hardware import torch_device_types
from harness.config.platforms import platform_facts, sleep_plan
from harness.engines.isolation import in_fresh_process
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


NO_SLEEP_ON_CPU = "a GPU/NPU for vLLM's sleep mode (vLLM CPU 0.32 has none)"


def vllm_on_cpu(engine_kind, detected_hardware) -> bool:
    """vLLM on CPU has no sleep mode (harness.engines.vllm enables it on GPU/NPU only): known before a 30 s start."""
    return engine_kind.name.startswith("vllm") and platform_facts(detected_hardware.kind).sleep_level is None


def vllm_wakes_here(engine_kind, detected_hardware, level: int, config: pytest.Config) -> None:
    """Skip (or fail, strict) where this vLLM cannot sleep: vLLM CPU, unless `--platform-stub npu` stands in
    vllm-ascend's weights-side sleep (level 1 keeps the weights, wake_up transposes the MoE experts back:
    harness.engines.ascend_moe_stub), at verl 0.9.1's NPU level only."""
    if not vllm_on_cpu(engine_kind, detected_hardware):
        return
    if config.getoption("platform_stub") != "npu":
        skip_or_fail(config, NO_SLEEP_ON_CPU, strict=False)
    elif level != platform_facts("npu").sleep_level:  # not a case of the stubbed platform: no real NPU to run it
        skip_or_fail(config, f"an NPU for level {level} (--platform-stub npu stands in verl 0.9.1's vllm-ascend sleep, "
                             f"level {platform_facts('npu').sleep_level} only)", strict=False)


def run_sleeping(engine_kind, detected_hardware, fn, *args):
    """`fn(make, *args)` with `make` building an engine meant to sleep: a vLLM engine gets sleep mode, and where a
    process holds only one of those (GPU / NPU), `fn` runs in a fresh process; other engines run here."""
    if not engine_kind.name.startswith("vllm"):
        return fn(engine_kind.make, *args)
    make = functools.partial(engine_kind.make, sleep_mode=True)
    if sleep_plan(detected_hardware.kind, sleeps=True).own_process:
        return in_fresh_process(fn, make, *args)
    return fn(make, *args)


def measure_sleep(make, level: int, dtype, devices: list[str]) -> dict:
    """Build an engine (dummy weights), sleep it at `level`, wake it: the device's memory at each point. The
    baseline is taken on every device type before the engine exists (the CPU reference engine on an NPU
    machine is measured on the CPU, not on the NPU), the engine's device kept."""
    baselines = {device: used_bytes(device) for device in devices}
    with make(SLEEP_SPEC, weights=None, load_format="dummy", dtype=dtype, seed=0) as engine:
        out = {"engine": engine.name, "device": engine.device, "supports_sleep": engine.supports_sleep}
        if not engine.supports_sleep:
            return out
        device = engine.device
        # vLLM allocates its weights and the whole KV pool at init: no rollout needed to be "loaded"
        loaded, torch_loaded = used_bytes(device), torch_allocated_bytes(device)
        engine.sleep(level=level)
        asleep, torch_asleep = used_bytes(device), torch_allocated_bytes(device)
        engine.wake_up()
    return {**out, "baseline_bytes": baselines[device], "loaded_bytes": loaded, "asleep_bytes": asleep,
            "torch_allocated_loaded": torch_loaded, "torch_allocated_asleep": torch_asleep}


def wake_and_sync(make, level: int, dtype, spec, model_dirs) -> dict:
    """verl's rollout loop, two steps of it, on an engine built on `old`: what differs from before sleep."""
    from harness.engines.weights import read_model_dir

    old, new = (read_model_dir(d) for d in model_dirs)
    failures = []
    with make(spec, weights=model_dirs[0], load_format="real", dtype=dtype, seed=0) as engine:
        if not engine.supports_sleep:
            return {"engine": engine.name, "device": engine.device, "supports_sleep": False}
        before = engine.generate(PROMPTS, MAX_TOKENS)
        for step, targets in enumerate(([old], [new, old]), 1):
            engine.sleep(level=level)
            engine.wake_up()
            for weights in targets:
                sync(engine, weights)
                # each update finalized after its last bucket, as verl does (vllm_rollout finish_weight_update); a
                # layerwise reload left open across two updates loads the second into processed layers
                engine.finish_sync()
            after = engine.generate(PROMPTS, MAX_TOKENS)
            diff = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            if diff:
                failures.append(f"step {step} (sleep(level={level}) -> wake_up -> sync "
                                f"{' -> '.join('new' if w is new else 'old' for w in targets)}): {len(diff)}/"
                                f"{len(before)} prompts generate differently, first prompt {diff[0]}: "
                                f"{before[diff[0]]} -> {after[diff[0]]}")
    return {"engine": engine.name, "device": engine.device, "supports_sleep": True, "failures": failures}


def needs_sleep(config: pytest.Config, run: dict) -> None:
    if not run["supports_sleep"]:
        skip_or_fail(config, f"sleep mode in {run['engine']} on {run['device']} (vLLM CPU 0.32 has none: "
                             "cpu_worker.sleep 'not supported on CPU')")


@pytest.mark.tiny
def test_sleep_returns_memory_to_preload_level(engine_kind, level, engine_dtype, detected_hardware, pytestconfig,
                                               record_property, expect):
    if vllm_on_cpu(engine_kind, detected_hardware):
        skip_or_fail(pytestconfig, NO_SLEEP_ON_CPU, strict=False)
    run = run_sleeping(engine_kind, detected_hardware, measure_sleep, level, engine_dtype,
                       torch_device_types(detected_hardware))
    needs_sleep(pytestconfig, run)
    verdict = check_sleep_release(run["engine"], run["device"], run["baseline_bytes"], run["loaded_bytes"],
                                  run["asleep_bytes"])
    record_property("memory.sleep", {k: v for k, v in run.items() if k != "supports_sleep"}
                    | {"level": level, "released": verdict.ok})
    expect(verdict)


@pytest.mark.tiny
def test_wake_up_generates_as_before_sleep(engine_kind, level, engine_dtype, detected_hardware, pytestconfig,
                                           mla_spec, mla_model_dirs):
    """verl's rollout loop, two steps of it: sleep after rollout, wake_up, sync (from one-shot generators in
    buckets, as verl does; after level 2 the weights come back only through it), roll out. Step 1 syncs `old`
    again, step 2 `new` then `old` (an engine that re-derives its absorbed copies on the first sync
    only passes one step). After each step the engine must generate as it did on `old` before any sleep. A wake
    path that loses or garbles weights, or copies discarded with the pool and not re-derived, changes tokens."""
    vllm_wakes_here(engine_kind, detected_hardware, level, pytestconfig)
    run = run_sleeping(engine_kind, detected_hardware, wake_and_sync, level, engine_dtype, mla_spec,
                       tuple(str(d) for d in mla_model_dirs))
    needs_sleep(pytestconfig, run)
    assert not run["failures"], f"{run['engine']}: " + "; ".join(run["failures"])


@pytest.mark.tiny
def test_moe_experts_resume_after_sleep(engine_kind, level, engine_dtype, detected_hardware, pytestconfig,
                                        moe_model_dirs):
    """The same loop on the tiny MoE model (issue 46, M4 / B2): vllm-ascend's wake_up transposes the MoE experts back
    to checkpoint layout, as new Parameters without a weight_loader (vllm-ascend v0.23.0 worker/worker.py
    NPUWorker.wake_up), and the sync after it must re-attach the loaders, load and re-derive (verl's
    patch_vllm_moe_model_weight_loader + process_weights_after_loading: harness.engines.vllm.prepare_moe_sync);
    the all-dense model above never wakes an MoE layer. After each step the engine generates as before any sleep.
    The plain kind cannot sync MoE on vllm-ascend and does not run here (fixtures/engines.py). On this CPU,
    `--platform-stub npu` runs it through vllm-ascend's MoE layer and wake_up (make rehearse)."""
    vllm_wakes_here(engine_kind, detected_hardware, level, pytestconfig)
    run = run_sleeping(engine_kind, detected_hardware, wake_and_sync, level, engine_dtype, MOE_SPEC,
                       tuple(str(d) for d in moe_model_dirs))
    needs_sleep(pytestconfig, run)
    assert not run["failures"], f"{run['engine']}: " + "; ".join(run["failures"])
