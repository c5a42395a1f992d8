"""Engines that need a process of their own, and the one way to give them one.

vLLM's sleep mode allocates weights and KV cache from a pluggable memory pool whose usage never returns to zero
in a process (harness.config.platforms `sleep_process_source`: vllm-ascend v0.20.2rc1 / v0.23.0
`NPUWorker.load_model` and vLLM's `gpu_worker._maybe_get_memory_pool_context` assert it is zero before loading),
so a process builds at most one sleep-mode engine (`claim_sleep_slot` says so in one line instead of the upstream
assert), and a suite that needs several builds each in `in_fresh_process`. Device memory measured by
`mem_get_info` is device-wide, so a measurement taken in the child is the device's, not the child's.

A fresh process starts from the environment this process was launched with, not the one engines left behind:
vllm-ascend v0.23.0 `platform.py` `NPUPlatform.check_and_update_config` writes
`PYTORCH_NPU_ALLOC_CONF=expandable_segments:True` into `os.environ` whenever sleep mode is off, and
`device_allocator/camem.py` `CaMemAllocator.__init__` asserts that setting is absent; a spawned child inherits
`os.environ`, so every sleep-mode engine built fresh after any non-sleep engine ran died on that assert.
`ENGINE_WRITTEN_ENV` names what engines write; the child gets those keys as they were at launch.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

_sleep_engines_built = 0  # sleep-mode engines built in this process

# Variables an engine writes into its own process (the upstream code above; vLLM's Model Runner V2 switch, which
# harness.engines.vllm sets for route capture and restores on close, too), restored to LAUNCH_ENV in a fresh child.
ENGINE_WRITTEN_ENV = ("PYTORCH_NPU_ALLOC_CONF", "VLLM_USE_V2_MODEL_RUNNER")
LAUNCH_ENV: dict[str, str | None] = {k: os.environ.get(k) for k in ENGINE_WRITTEN_ENV}  # read once, at import


def claim_sleep_slot(limit: int | None, why: str) -> None:
    """Count a sleep-mode engine about to be built in this process; RuntimeError naming the upstream limit once
    `limit` engines have been (None: no limit)."""
    global _sleep_engines_built
    if limit is not None and _sleep_engines_built >= limit:
        raise RuntimeError(f"sleep-mode vLLM engine {_sleep_engines_built + 1} in process {os.getpid()}: at most "
                           f"{limit} per process ({why}); build it in harness.engines.isolation.in_fresh_process")
    _sleep_engines_built += 1


def _child(payload: bytes, env: dict[str, str | None], out: str) -> None:
    # the launch environment before the target's module is even imported (it arrives pickled for that reason)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        target, args = pickle.loads(payload)
        result = ("ok", target(*args))
    except BaseException as exc:  # noqa: BLE001 -- reported to the parent, whatever it is
        result = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    with open(out, "wb") as f:
        pickle.dump(result, f)


def in_fresh_process(target: Callable, *args, timeout: float = 900) -> Any:
    """`target(*args)` in a fresh spawned process; returns what it returned (picklable). A plain, non-daemonic
    `mp.Process` per call: a daemonic pool worker cannot start vLLM's own children, and two engines in one worker
    would share (and leak) the device. The child's exception comes back as a RuntimeError with its traceback; no
    result after `timeout` seconds kills the child (TimeoutError). The result travels as a pickle written by the
    child into a private temporary directory this process created (mode 0700), never a file anyone else wrote.
    The child's ENGINE_WRITTEN_ENV is this process's launch environment (LAUNCH_ENV), whatever engines set since."""
    name = getattr(target, "__qualname__", repr(target))
    with tempfile.TemporaryDirectory(prefix="harness-fresh-") as tmp:
        out = os.path.join(tmp, "result.pickle")
        payload = pickle.dumps((target, args))
        proc = mp.get_context("spawn").Process(target=_child, args=(payload, dict(LAUNCH_ENV), out),
                                               name=f"harness-{name}")
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise TimeoutError(f"{name}: no result after {timeout:.0f} s in a fresh process")
        if not os.path.exists(out):
            raise RuntimeError(f"{name}: the fresh process exited {proc.exitcode} without a result (its log is above)")
        with open(out, "rb") as f:
            status, *rest = pickle.load(f)
    if status == "ok":
        return rest[0]
    message, trace = rest
    raise RuntimeError(f"{name} failed in a fresh process: {message}\n{trace}")
