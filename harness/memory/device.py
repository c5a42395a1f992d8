"""Measured memory of a real device, and the sleep-mode release check.

Seed 001: after vLLM's rollout, sleep mode unmaps the weights and KV cache with aclrtFreePhysical
inside vllm-ascend's CaMemAllocator, which torch's caching allocator never sees, so
`torch.npu.memory_allocated` and the device-level numbers disagree. `used_bytes` therefore reads the
device level (mem_get_info: total - free) on NPU/GPU, and the process's resident memory on CPU;
`torch_allocated_bytes` gives the allocator's view next to it.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from harness.errors import BadInput
from harness.findings import Finding

MiB = 1024**2


def _accel(device_type: str):
    import torch

    if device_type == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)

        return torch.npu
    if device_type == "cuda":
        return torch.cuda
    raise BadInput(f"device type {device_type!r}: use cpu, cuda or npu")


def _malloc_trim() -> None:
    """Return glibc's freed-but-cached heap to the OS, so RSS follows live allocations instead of
    drifting down later when memory freed long ago is finally trimmed (no-op without glibc)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def used_bytes(device_type: str = "cpu") -> int:
    """Memory in use now: device total - free (npu, cuda; all processes on the device), or this
    process's resident set (cpu)."""
    gc.collect()
    if device_type == "cpu":
        _malloc_trim()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    accel = _accel(device_type)
    accel.synchronize()
    free, total = accel.mem_get_info()
    return total - free


def torch_allocated_bytes(device_type: str = "cpu") -> int | None:
    """torch's caching-allocator view (None on CPU, which has no allocator statistics)."""
    return None if device_type == "cpu" else _accel(device_type).memory_allocated()


@dataclass(frozen=True)
class SleepRelease:
    """Memory before the engine loaded, after it loaded (and ran), and after sleep."""

    engine: str
    device_type: str
    baseline: int
    loaded: int
    asleep: int
    rtol: float = 0.10  # the residual may be this fraction of what loading took...
    atol: int = 16 * MiB  # ...plus allocator/page-cache noise

    @property
    def loaded_delta(self) -> int:
        return self.loaded - self.baseline

    @property
    def residual(self) -> int:
        return self.asleep - self.baseline

    @property
    def ok(self) -> bool:
        return self.loaded_delta > self.atol and self.residual <= self.rtol * self.loaded_delta + self.atol

    def message(self) -> str:
        if self.loaded_delta <= self.atol:
            return (f"{self.engine} on {self.device_type}: loading took {self.loaded_delta / MiB:.1f} MiB, not more "
                    f"than the {self.atol / MiB:.0f} MiB noise floor: nothing measurable to release")
        return (f"{self.engine} on {self.device_type}: loading took {self.loaded_delta / MiB:.1f} MiB, after sleep "
                f"{self.residual / MiB:.1f} MiB ({self.residual / self.loaded_delta:.0%}) remain above the pre-load "
                f"level (allowed {self.rtol:.0%} + {self.atol / MiB:.0f} MiB)")

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("memory.sleep", "resident bytes", f"{self.engine} on {self.device_type}",
                                           self.message()),)


def check_sleep_release(engine: str, device_type: str, baseline: int, loaded: int, asleep: int) -> SleepRelease:
    """Verdict: after sleep, memory is back near the pre-load level."""
    return SleepRelease(engine, device_type, baseline, loaded, asleep)
