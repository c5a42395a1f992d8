"""harness.engines.isolation: a function run in a fresh spawned process returns its result, its failure comes back
by name, a hang is killed -- the path the sleep suite's vLLM cases take on GPU / NPU (one sleep-mode engine per
process), exercised here on CPU with the real reference engine sleeping in the child."""
from __future__ import annotations

import os
import time

import pytest

from harness.engines.isolation import in_fresh_process


def _pid() -> int:
    return os.getpid()


def _fails(message: str) -> None:
    raise ValueError(message)


def _hangs() -> None:
    time.sleep(60)


def _reference_sleeps(level: int) -> dict:
    """The sleep suite's shape: build an engine in the child, sleep and wake it, report what it saw."""
    import torch

    from harness.config.models import TINY
    from harness.engines.reference import make_reference_engine

    with make_reference_engine(TINY, weights=None, load_format="dummy", dtype=torch.float32) as engine:
        name, kv_b = next((n, t) for n, t in engine.synced_weights().items() if n.endswith("kv_b_proj.weight"))
        before = kv_b.clone()
        engine.sleep(level=level)
        freed = kv_b.untyped_storage().nbytes() == 0
        engine.wake_up()
        return {"pid": os.getpid(), "supports_sleep": engine.supports_sleep, "weight": name, "freed": freed,
                "restored": torch.equal(kv_b, before)}


def _camem_init() -> str:
    """What vllm-ascend v0.23.0 device_allocator/camem.py CaMemAllocator.__init__ asserts, in the child."""
    conf = os.environ.get("PYTORCH_NPU_ALLOC_CONF", "")
    assert "expandable_segments:True" not in conf, f"Expandable segments are not compatible ({conf})"
    return conf


def test_child_gets_the_launch_allocator_setting_not_the_engines(monkeypatch):
    """vllm-ascend v0.23.0 platform.py check_and_update_config writes PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
    into this process whenever sleep mode is off; a sleep-mode engine built fresh afterwards must not inherit it
    (seeded: without the restore the child's CaMemAllocator assert fires)."""
    from harness.engines import isolation

    monkeypatch.setitem(isolation.LAUNCH_ENV, "PYTORCH_NPU_ALLOC_CONF", "page_size:1g")  # the user's own setting
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "page_size:1g,expandable_segments:True")  # what vllm-ascend leaves
    assert in_fresh_process(_camem_init) == "page_size:1g"
    monkeypatch.setitem(isolation.LAUNCH_ENV, "PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(RuntimeError, match="AssertionError: Expandable segments are not compatible"):
        in_fresh_process(_camem_init)  # the check can fail: a launch setting that breaks it is passed on


def test_result_comes_from_another_process():
    assert in_fresh_process(_pid) != os.getpid()


def test_the_childs_failure_is_named():
    with pytest.raises(RuntimeError, match="_fails failed in a fresh process: ValueError: stale impl copies"):
        in_fresh_process(_fails, "stale impl copies")


def test_a_hung_child_is_killed():
    with pytest.raises(TimeoutError, match="_hangs: no result after 3 s"):
        in_fresh_process(_hangs, timeout=3)


def test_an_engine_sleeps_in_a_fresh_process():
    run = in_fresh_process(_reference_sleeps, 1)
    assert run["pid"] != os.getpid() and run["supports_sleep"], run
    assert run["freed"] and run["restored"], f"level-1 sleep in the child did not free and restore {run['weight']}"
