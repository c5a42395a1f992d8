"""A stub of verl's Ascend platform, so code that must not run on it is rehearsed on this CPU (issue 46, B1).

On an NPU host verl 0.9.1 resolves its platform once per process (verl/plugin/platform/platform_manager.py
`_detect_platform_name`: `huawei` as soon as torch_npu imports, `PlatformNPU.is_platform_available(use_smi_check=
True)`), and `get_device_id()` is then `PlatformNPU.current_device()`, i.e. `torch.npu.current_device()`
(verl/plugin/platform/platform_npu.py). verl's Megatron export allocates with it: `broadcast_from_megatron_pp`
(verl/utils/megatron_utils.py) creates a non-owning PP rank's buffer with `torch.empty(..., device=get_device_id())`
and broadcasts it over megatron's PP group -- gloo in the harness's CPU sender, which has backends for cpu (and
cuda) only. The Megatron sender suite's exporter therefore failed on every NPU night, where the CPU host never
showed it.

This module registers `StubPlatformNPU` under verl's own name for it (`huawei`) with PlatformNPU's answers
(device `npu`, backend `hccl`, Ray resource `NPU`, ASCEND_RT_VISIBLE_DEVICES); its current device is `npu:0`, torch's
PrivateUse1 device renamed `npu` as torch_npu names it, with no NPU behind it: a tensor put there raises
(`No module named 'torch.npu'`) where on the NPU host it is made and gloo then refuses it. (`meta`, which allocates,
was tried first: gloo broadcasts a meta tensor silently, leaving it empty.) verl's auto-detection picks the stub as
it picks PlatformNPU on an NPU host. Only for processes that import it (ENV): the rename is process-wide, and made
only when verl asks for the device (`npu_device`).

Loaded the way verl loads platform plugins: `VERL_USE_EXTERNAL_MODULES=harness.engines.verl_npu_stub` (ENV) makes
`import verl` import it in every process that imports verl (verl/__init__.py `import_external_libs`).
"""
from __future__ import annotations

import types

import torch

PLATFORM_NAME = "huawei"  # verl 0.9.1 platform_npu.py @PlatformRegistry.register(platform="huawei")
ENV = {"VERL_USE_EXTERNAL_MODULES": __name__}


def _device_module() -> types.ModuleType:
    """What `get_torch_device()` returns (torch.npu upstream): the calls verl makes on it, on the stub device."""
    module = types.ModuleType("harness_stub_npu")
    module.current_device = lambda: 0
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.synchronize = module.set_device = module.empty_cache = lambda *a, **k: None
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.memory_allocated = module.memory_reserved = module.max_memory_allocated = lambda *a, **k: 0
    return module


def npu_device() -> torch.device:
    """`npu:0`: torch's PrivateUse1 renamed as torch_npu names it, only once verl asks for its device. Renamed at
    import, torch's own accelerator queries in the sender's ranks then raised ("Please register
    PrivateUse1HooksInterface") before any verl code ran."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    return torch.device("npu", 0)


def register() -> None:
    """Register the stub under `huawei` (replacing verl's PlatformNPU, whose torch_npu is absent here)."""
    from verl.plugin.platform import PlatformRegistry

    from harness.engines.verl_platform import host_platform_base

    registered = PlatformRegistry.get(PLATFORM_NAME)
    if getattr(registered, "harness_stub", False):
        return
    device = _device_module()

    @PlatformRegistry.register(platform=PLATFORM_NAME)
    class StubPlatformNPU(host_platform_base()):
        """verl 0.9.1 verl/plugin/platform/platform_npu.py PlatformNPU, on the stub device (module docstring)."""

        harness_stub = True
        device_name = "npu"
        vendor_name = "huawei"
        device_module = device

        def is_platform_available(self, use_smi_check=False) -> bool:
            return True  # PlatformNPU: torch_npu imports (use_smi_check) -- the NPU host's answer

        def current_device(self):
            return npu_device()

        def communication_backend_name(self) -> str:
            return "hccl"

        def visible_devices_envvar(self) -> str:
            return "ASCEND_RT_VISIBLE_DEVICES"

        def ray_resource_name(self) -> str:
            return "NPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"]


register()
