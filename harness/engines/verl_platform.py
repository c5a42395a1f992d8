"""The half of verl 0.9.1's platform interface (verl/plugin/platform/platform_base.py `PlatformBase`) that a platform
with no device runtime behind it answers alike: available, one device, seeding through torch, and no-ops for device
selection, synchronisation, the allocator, NVTX, the profiler, IPC and cudart.

Two such platforms run verl here: the CPU tier's (harness.launch.verl_cpu `PlatformCPU`, the tiny verl runs) and the
stub of verl's Ascend platform (harness.engines.verl_npu_stub `StubPlatformNPU`, issue 46 B1). Each states only what
makes it that platform (device, backend, Ray resource, visible-devices variable); they once repeated these 14 methods
each (issue 46, D1). verl is imported when the base is asked for, after verl's own import has run the plugin module.
"""
from __future__ import annotations

import contextlib
import functools

import torch


@functools.cache
def host_platform_base() -> type:
    """A `PlatformBase` subclass with the answers above; subclass it and register the subclass with verl."""
    from verl.plugin.platform import PlatformBase

    class HostPlatform(PlatformBase):
        def is_available(self) -> bool:
            return True

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return HostPlatform
