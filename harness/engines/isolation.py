"""Engines that need a process of their own, and the one way to give them one.

vLLM's sleep mode allocates weights and KV cache from a pluggable memory pool whose usage never returns to zero
in a process (harness.config.platforms `sleep_process_source`: vllm-ascend v0.20.2rc1 / v0.23.0
`NPUWorker.load_model` and vLLM's `gpu_worker._maybe_get_memory_pool_context` assert it is zero before loading),
so a process builds at most one sleep-mode engine (`claim_sleep_slot` says so in one line instead of the upstream
assert), and a suite that needs several builds each in `in_fresh_process`. Device memory measured by
`mem_get_info` is device-wide, so a measurement taken in the child is the device's, not the child's.
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


def claim_sleep_slot(limit: int | None, why: str) -> None:
    """Count a sleep-mode engine about to be built in this process; RuntimeError naming the upstream limit once
    `limit` engines have been (None: no limit)."""
    global _sleep_engines_built
    if limit is not None and _sleep_engines_built >= limit:
        raise RuntimeError(f"sleep-mode vLLM engine {_sleep_engines_built + 1} in process {os.getpid()}: at most "
                           f"{limit} per process ({why}); build it in harness.engines.isolation.in_fresh_process")
    _sleep_engines_built += 1


def _child(target: Callable, args: tuple, out: str) -> None:
    try:
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
    child into a private temporary directory this process created (mode 0700), never a file anyone else wrote."""
    name = getattr(target, "__qualname__", repr(target))
    with tempfile.TemporaryDirectory(prefix="harness-fresh-") as tmp:
        out = os.path.join(tmp, "result.pickle")
        proc = mp.get_context("spawn").Process(target=_child, args=(target, args, out), name=f"harness-{name}")
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
