"""What is installed here, told by source and behaviour where the package versions lie.

MindSpeed's `setup.py` says `__version__ = '0.12.1'` at v2.2.0_core_r0.12.1 and v2.3.0_core_r0.12.1 alike, and
mbridge's `pyproject.toml` says 0.15.1 at v0.15.1, 680253f and 10cb17f alike, so a version string can neither accept
the right source nor name the wrong one's bug. Each detector below reads or runs the installed code itself and
returns a `Detection`; the plain predicates (`mindspeed_scale_bug_present`, `mbridge_reads_rope_theta`) are what a
known-bug table calls. `doctor` (harness/cli/doctor_cmd.py) and the supported-stack rows (harness/config/stacks.py,
`Pin.bug`) use them. Every detector takes the package's root directory (a source tree) so it can be run on any tree;
by default it finds the installed one without importing it (importing `mindspeed.megatron_adaptor` patches the
process).
"""
from __future__ import annotations

import ast
import builtins
import importlib.util
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

# The Ascend driver's own directory: the MindCluster job samples mount exactly this hostPath into every NPU pod
# (Ascend/mindcluster-deploy samples/train/basic-training/ranktable/yaml/910b/a800_pytorch_vcjob.yaml `ascend-driver`)
# and vllm-ascend v0.23.0 docs/source/installation.md mounts /usr/local/Ascend/driver/version.info into its
# containers. Not $ASCEND_HOME_PATH: CANN's set_env.sh points that at the toolkit (`ASCEND_HOME_PATH=
# ${ASCEND_TOOLKIT_HOME}`), where there is no driver/ at all.
ASCEND_DRIVER = Path("/usr/local/Ascend/driver")

# DeepSeek-V3's MLA softmax scale and the kv_channels mbridge gives Megatron for it (mbridge core/llm_bridge.py
# `"kv_channels": ("head_dim", None)`; transformers' DeepseekV3Config sets head_dim = qk_rope_head_dim = 64): the
# inputs the MindSpeed probe hands the installed adaptor.
DSV3_SOFTMAX_SCALE = 0.1352337788608801
DSV3_KV_CHANNELS = 64


@dataclass(frozen=True)
class Detection:
    """present: True the bug is in the installed code, False it is fixed, None could not tell. detail: what was
    read or run, and what it showed (one line)."""

    present: bool | None
    detail: str


def key_value_file(path: Path, key: str) -> str | None:
    """`key=value` from an Ascend version file (ascend_toolkit_install.info `version=`, driver version.info
    `Version=`)."""
    try:
        for line in path.read_text(errors="replace").splitlines():
            k, sep, v = line.partition("=")
            if sep and k.strip().lower() == key.lower():
                return v.strip()
    except OSError:
        return None
    return None


def driver_version(root: Path = ASCEND_DRIVER) -> str | None:
    """The Ascend driver's version (`Version=` of <driver>/version.info)."""
    return key_value_file(root / "version.info", "Version")


def cann_version(toolkit: Path | None = None) -> str | None:
    """CANN from the toolkit's own version files: <toolkit>/<arch>-linux/ascend_toolkit_install.info `version=`
    (what the nightly workflow prints), else compiler/version.info, toolkit/version.info or version.cfg. The
    toolkit is $ASCEND_TOOLKIT_HOME or $ASCEND_HOME_PATH (CANN's set_env.sh sets both to it), else the default
    /usr/local/Ascend/ascend-toolkit/latest."""
    if toolkit is None:
        env = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
        toolkit = Path(env) if env else Path("/usr/local/Ascend/ascend-toolkit/latest")
    for path in (toolkit / f"{platform.machine()}-linux" / "ascend_toolkit_install.info",
                 toolkit / "ascend_toolkit_install.info", toolkit / "compiler" / "version.info",
                 toolkit / "toolkit" / "version.info"):
        found = key_value_file(path, "version")
        if found:
            return found
    try:  # version.cfg: `runtime_running_version=[7.6.0.1.220:8.0.0]`-style lines
        for line in (toolkit / "version.cfg").read_text(errors="replace").splitlines():
            if "version" in line.lower() and "=" in line:
                return line.split("=", 1)[1].strip().strip('"[]')
    except OSError:
        pass
    return None


def package_root(name: str) -> Path | None:
    """The directory of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def _function(path: Path, name: str) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except (OSError, SyntaxError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


class _Anything(SimpleNamespace):
    """A config whose fields not set explicitly read as 0 (the probe only needs what decides the scale)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return 0


MINDSPEED_ADAPTOR = "core/transformer/flash_attention/flash_attention/adaptor.py"


def mindspeed_scale_bug(root: Path | None = None) -> Detection:
    """Seed 001's MLA softmax scale, by running the installed MindSpeed's `dot_product_attention_forward_impl`
    (mindspeed/core/transformer/flash_attention/flash_attention/adaptor.py, registered with --use-flash-attn) on
    stand-ins and recording the `scale=` it hands `torch_npu.npu_fusion_attention`. Ascend/MindSpeed
    v2.2.0_core_r0.12.1 passes `1.0 / math.sqrt(self.hidden_size_per_attention_head)` whenever
    `scale_mask_softmax.scale is None` (0.125 with DSV3's kv_channels 64; Megatron-LM core_v0.12.1
    dot_product_attention.py `DotProductAttention.__init__` sets hidden_size_per_attention_head = kv_channels);
    v2.3.0_core_r0.12.1 passes `self.softmax_scale` (commit b49b42bb "fix: different scale for mla")."""
    root = root or package_root("mindspeed")
    if root is None:
        return Detection(None, "MindSpeed is not installed")
    path = root / MINDSPEED_ADAPTOR
    fn = _function(path, "dot_product_attention_forward_impl")
    if fn is None:
        return Detection(None, f"{path}: no dot_product_attention_forward_impl to probe")
    for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs):
        arg.annotation = None  # the annotations name Megatron / torch types the probe does not import
    fn.returns = None
    passed: list = []

    def npu_fusion_attention(*args, **kwargs):
        passed.append(kwargs.get("scale"))
        return [None]

    namespace = {"__builtins__": builtins, "math": math, "torch_npu": SimpleNamespace(
        npu_fusion_attention=npu_fusion_attention), "rearrange": lambda x, *a, **k: x,
        "AttnMaskType": SimpleNamespace(no_mask="no_mask", causal="causal")}
    query = SimpleNamespace(shape=(4, 1, 2, 192))
    layer = _Anything(softmax_scale=DSV3_SOFTMAX_SCALE, hidden_size_per_attention_head=DSV3_KV_CHANNELS,
                      scale_mask_softmax=SimpleNamespace(scale=None), attention_dropout=SimpleNamespace(p=0.0),
                      config=_Anything())
    try:
        exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), str(path), "exec"),
             namespace)
        namespace[fn.name](layer, query, query, query, None, attn_mask_type="causal", attention_bias=None,
                           packed_seq_params=None)
    except Exception as exc:  # noqa: BLE001 -- a source this probe does not understand: say so, never guess
        return Detection(None, f"{path}: dot_product_attention_forward_impl did not run on the probe "
                               f"({type(exc).__name__}: {exc})")
    if not passed or not isinstance(passed[0], (int, float)):
        return Detection(None, f"{path}: dot_product_attention_forward_impl passed no numeric scale= "
                               f"to npu_fusion_attention ({passed})")
    scale = float(passed[0])
    if math.isclose(scale, DSV3_SOFTMAX_SCALE, rel_tol=1e-9):
        return Detection(False, f"{path}: passes softmax_scale to npu_fusion_attention (v2.3.0_core_r0.12.1's fix)")
    return Detection(True, f"{path}: passes scale={scale:.4g} to npu_fusion_attention instead of softmax_scale "
                           f"{DSV3_SOFTMAX_SCALE:.4g} for DSV3 (seed 001's MLA scale bug, as v2.2.0_core_r0.12.1 does)")


def mindspeed_scale_bug_present(root: Path | None = None) -> bool | None:
    return mindspeed_scale_bug(root).present


def _reads_attribute(path: Path, attribute: str) -> int | None:
    """Line of the first `<...>.<attribute>` read in a file, or None."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except (OSError, SyntaxError):
        return None
    return next((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == attribute
                 and isinstance(n.ctx, ast.Load)), None)


def mbridge_rope_theta_bug(root: Path | None = None) -> Detection:
    """Whether the installed mbridge's DeepSeek-V3 bridge (which verl builds Megatron from, for DSV3 and Moonlight)
    gets rope_theta from a transformers-5 config, which keeps it only in `rope_parameters`. ISEEKYAN/mbridge v0.15.1
    models/deepseek_v3.py reads `hf_config.rope_theta` (AttributeError under transformers 5); 680253f reads it
    through utils/hf_config.get_hf_rope_theta, whose module does not import (it annotates with PretrainedConfig and
    never imports it: NameError; fixed by 9ad77d7 "fix import (#103)"); 10cb17f imports and works. So: the bridge's
    source must not read `.rope_theta`, and get_hf_rope_theta, loaded from the installed file and called on a
    config that has only `rope_parameters`, must return its theta."""
    root = root or package_root("mbridge")
    if root is None:
        return Detection(None, "mbridge is not installed")
    bridge = root / "models" / "deepseek_v3.py"
    if not bridge.is_file():
        return Detection(None, f"{bridge}: no DeepSeek-V3 bridge to read")
    line = _reads_attribute(bridge, "rope_theta")
    if line is not None:
        return Detection(True, f"{bridge}:{line} reads hf_config.rope_theta, which transformers 5 moved into "
                               "rope_parameters (mbridge v0.15.1)")
    helper = root / "utils" / "hf_config.py"
    spec = importlib.util.spec_from_file_location("_harness_probe_mbridge_hf_config", helper)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        theta = module.get_hf_rope_theta(SimpleNamespace(rope_parameters={"rope_type": "yarn", "rope_theta": 1.25e4}))
    except Exception as exc:  # noqa: BLE001 -- whatever breaks, the Megatron engine would not build
        return Detection(True, f"{helper}: get_hf_rope_theta fails on a transformers-5 config "
                               f"({type(exc).__name__}: {exc})")
    if theta != 1.25e4:
        return Detection(True, f"{helper}: get_hf_rope_theta returned {theta!r} for rope_parameters' 12500.0")
    return Detection(False, f"{helper}: get_hf_rope_theta reads rope_parameters (transformers 5)")


def mbridge_reads_rope_theta(root: Path | None = None) -> bool | None:
    return mbridge_rope_theta_bug(root).present


def vllm_ascend_physical_routes_bug(root: Path | None = None) -> Detection:
    """Whether the installed vllm-ascend captures the rollout's routed experts after the EPLB map: main's
    ops/fused_moe/routed_experts.py `AscendRoutedExperts._select_experts` did `topk_ids = self.log2phy[topk_ids]`
    before `capturer.capture(...)` (vllm-ascend #13268; #13882 captures first). Tags up to v0.25.1rc1 have no such
    file and capture in fused_moe.py's apply before log2phy (logical ids)."""
    root = root or package_root("vllm_ascend")
    if root is None:
        return Detection(None, "vllm-ascend is not installed")
    path = root / "ops" / "fused_moe" / "routed_experts.py"
    if not path.is_file():
        return Detection(False, f"{path.parent}: no routed_experts.py (the capture precedes log2phy in fused_moe.py)")
    fn = _function(path, "_select_experts")
    if fn is None:
        return Detection(None, f"{path}: no _select_experts to read")
    text = ast.unparse(fn)  # that function's statements in order, comments and the rest of the file left out
    mapped, captured = text.find("log2phy[topk_ids]"), text.find(".capture(")
    if captured < 0:
        return Detection(None, f"{path}: _select_experts makes no capture call")
    if 0 <= mapped < captured:
        return Detection(True, f"{path}: log2phy is applied to topk_ids before the routed-experts capture "
                               "(physical ids: vllm-ascend #13268)")
    return Detection(False, f"{path}: the capture precedes log2phy (logical ids)")


def vllm_ascend_captures_physical_ids(root: Path | None = None) -> bool | None:
    return vllm_ascend_physical_routes_bug(root).present


# Pin name -> its detector (harness.config.stacks `Pin.bug` names what the detector looks for).
KNOWN_BUG_DETECTORS = {"mindspeed": mindspeed_scale_bug, "mbridge": mbridge_rope_theta_bug}
