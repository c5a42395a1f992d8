"""Installed-stack detection where versions lie (harness.config.installed), on simulated source trees in tmp dirs,
and `doctor` end to end on a simulated NPU machine: the v2.3.0 + fixed-mbridge stack is SUPPORTED, a v2.2.0 one
names seed 001's scale bug, an unfixed mbridge names rope_theta.

The trees hold the decisive code of each upstream version, copied from the source (Ascend/MindSpeed
v2.2.0_core_r0.12.1 / v2.3.0_core_r0.12.1 mindspeed/core/transformer/flash_attention/flash_attention/adaptor.py;
ISEEKYAN/mbridge v0.15.1 / 680253f / 10cb17f mbridge/models/deepseek_v3.py and mbridge/utils/hf_config.py); both
MindSpeed trees report 0.12.1 and all three mbridge trees 0.15.1, as the real ones do.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.config import installed
from harness.config.installed import (
    DSV3_KV_CHANNELS,
    DSV3_SOFTMAX_SCALE,
    cann_version,
    driver_version,
    key_value_file,
    mbridge_reads_rope_theta,
    mbridge_rope_theta_bug,
    mindspeed_scale_bug,
    mindspeed_scale_bug_present,
)

# dot_product_attention_forward_impl as MindSpeed ships it; {scale} is the one statement v2.3.0 changed (b49b42bb)
ADAPTOR = '''\
import math
from typing import Optional

from torch import Tensor
import torch_npu

from megatron.core.transformer.dot_product_attention import DotProductAttention as MegatronDotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.packed_seq_params import PackedSeqParams

try:
    from einops import rearrange
except ImportError:
    rearrange = None


def dot_product_attention_forward_impl(
    self,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor,
    attn_mask_type: AttnMaskType = None,
    attention_bias: Tensor = None,
    packed_seq_params: Optional[PackedSeqParams] = None,
):
    assert attention_bias is None, \\
        "Attention bias is not supported for DotProductAttention."

    if packed_seq_params is None:
        seq_length, bsz, n_head, head_dim = (
            query.shape[0], query.shape[1], query.shape[2], query.shape[3]
        )
    else:
        seq_length, n_head, head_dim = (
            query.shape[0], query.shape[1], query.shape[2]
        )

    sparse_mode = self.config.sparse_mode
    if attn_mask_type == AttnMaskType.no_mask:
        sparse_mode = 0  # default mask

{scale}

    if packed_seq_params is not None: # TND
        actual_seq_qlen = packed_seq_params.cu_seqlens_q.tolist()
        actual_seq_kvlen = packed_seq_params.cu_seqlens_kv.tolist()
        shape_order = 'TND'
    else: # SBH
        actual_seq_qlen = None
        actual_seq_kvlen = None
        query, key, value = (
            [
                rearrange(x, 's b h d -> s b (h d)')
                for x in [query, key, value]
            ]
        )
        shape_order = 'SBH'

    output = torch_npu.npu_fusion_attention(
        query, key, value,
        n_head,
        shape_order,
        pse=None,
        padding_mask=None,
        atten_mask=attention_mask,
        scale=scale,
        pre_tockens=self.config.pre_tockens,
        next_tockens=self.config.next_tockens,
        keep_prob=1 - self.attention_dropout.p,
        inner_precise=0,
        sparse_mode=sparse_mode,
        actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen
    )[0]

    return output
'''
SCALE_V220 = '''\
    scale = (
        1.0 / math.sqrt(self.hidden_size_per_attention_head)
        if self.scale_mask_softmax.scale is None
        else self.softmax_scale
    )'''
SCALE_V230 = "    scale = self.softmax_scale"

# mbridge/models/deepseek_v3.py, the MLA part of _build_config
BRIDGE_V0151 = '''\
class DeepseekV3Bridge:
    def _build_config(self):
        hf_config = self.hf_config
        return dict(
            q_lora_rank=hf_config.q_lora_rank,
            qk_pos_emb_head_dim=hf_config.qk_rope_head_dim,
            v_head_dim=hf_config.v_head_dim,
            rotary_base=hf_config.rope_theta,
        )
'''
BRIDGE_FIXED = '''\
from ..utils.hf_config import get_hf_rope_theta


class DeepseekV3Bridge:
    def _build_config(self):
        hf_config = self.hf_config
        return {
            "q_lora_rank": hf_config.q_lora_rank,
            "qk_pos_emb_head_dim": hf_config.qk_rope_head_dim,
            "v_head_dim": hf_config.v_head_dim,
            "rotary_base": get_hf_rope_theta(hf_config),
        }
'''
# mbridge/utils/hf_config.py; 680253f lacks the import (NameError at the annotation), 9ad77d7 added it
HF_CONFIG = '''\
{imports}
def get_hf_rope_theta(hf_config: PretrainedConfig) -> float:
    # For transformers <= 4.57.6
    if hasattr(hf_config, "rope_theta"):
        return hf_config.rope_theta
    if hasattr(hf_config, "text_config") and hasattr(hf_config.text_config, "rope_theta"):
        return hf_config.text_config.rope_theta

    # For transformers >= 5.0.0, check rope_parameters dict (optionally nested) for rope_theta
    rp = None
    if hasattr(hf_config, "rope_parameters"):
        rp = hf_config.rope_parameters
    elif hasattr(hf_config, "text_config") and hasattr(hf_config.text_config, "rope_parameters"):
        rp = hf_config.text_config.rope_parameters
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            return rp["rope_theta"]
        for v in rp.values():
            if isinstance(v, dict) and "rope_theta" in v:
                return v["rope_theta"]
    raise AttributeError("cannot determine RoPE base.")
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def mindspeed_tree(root: Path, version: str) -> Path:
    pkg = root / f"MindSpeed-{version}" / "mindspeed"
    write(pkg / "__init__.py", "")
    write(pkg / "../setup.py", "__version__ = '0.12.1'\n")  # both tags say so (setup.py)
    scale = {"2.2.0": SCALE_V220, "2.3.0": SCALE_V230}[version]
    write(pkg / installed.MINDSPEED_ADAPTOR, ADAPTOR.format(scale=scale))
    return pkg


def mbridge_tree(root: Path, commit: str) -> Path:
    pkg = root / f"mbridge-{commit}" / "mbridge"
    write(pkg / "__init__.py", '__version__ = "0.15.1"\n')
    write(pkg / "models" / "deepseek_v3.py", BRIDGE_V0151 if commit == "v0.15.1" else BRIDGE_FIXED)
    if commit != "v0.15.1":  # v0.15.1 has no utils/hf_config.py
        imports = "" if commit == "680253f" else "from transformers import PretrainedConfig\n"
        write(pkg / "utils" / "hf_config.py", HF_CONFIG.format(imports=imports))
    return pkg


def test_probe_inputs_are_dsv3s():
    from harness.config.models import DEEPSEEK_V3
    from harness.mla.derive import softmax_scale

    assert DSV3_SOFTMAX_SCALE == softmax_scale(DEEPSEEK_V3) and DSV3_KV_CHANNELS == DEEPSEEK_V3.qk_rope_head_dim


def test_mindspeed_is_told_by_what_its_adaptor_passes(tmp_path):
    bug = mindspeed_scale_bug(mindspeed_tree(tmp_path, "2.2.0"))
    assert bug.present is True and "scale=0.125" in bug.detail and "seed 001" in bug.detail
    assert math.isclose(1 / math.sqrt(DSV3_KV_CHANNELS), 0.125)
    fixed = mindspeed_scale_bug(mindspeed_tree(tmp_path, "2.3.0"))
    assert fixed.present is False and "softmax_scale" in fixed.detail
    assert mindspeed_scale_bug_present(mindspeed_tree(tmp_path, "2.2.0")) is True


def test_mindspeed_it_cannot_read_is_unknown_never_fixed(tmp_path):
    pkg = mindspeed_tree(tmp_path, "2.3.0")
    (pkg / installed.MINDSPEED_ADAPTOR).write_text("def something_else():\n    pass\n")
    assert mindspeed_scale_bug(pkg).present is None
    (pkg / installed.MINDSPEED_ADAPTOR).write_text(ADAPTOR.format(scale="    scale = undefined_helper(self)"))
    unknown = mindspeed_scale_bug(pkg)
    assert unknown.present is None and "NameError" in unknown.detail
    assert mindspeed_scale_bug(tmp_path / "nowhere").present is None


def test_mbridge_is_told_by_behaviour(tmp_path):
    old = mbridge_rope_theta_bug(mbridge_tree(tmp_path, "v0.15.1"))
    assert old.present is True and "deepseek_v3.py:8 reads hf_config.rope_theta" in old.detail
    no_import = mbridge_rope_theta_bug(mbridge_tree(tmp_path, "680253f"))
    assert no_import.present is True and "NameError" in no_import.detail and "PretrainedConfig" in no_import.detail
    fixed = mbridge_rope_theta_bug(mbridge_tree(tmp_path, "10cb17f"))
    assert fixed.present is False, fixed.detail
    assert mbridge_reads_rope_theta(mbridge_tree(tmp_path, "v0.15.1")) is True
    broken = mbridge_tree(tmp_path, "10cb17f")
    (broken / "utils" / "hf_config.py").write_text("def get_hf_rope_theta(c):\n    return c.rope_theta\n")
    assert mbridge_rope_theta_bug(broken).present is True, "a helper that still reads rope_theta is the bug"


def test_driver_is_read_from_the_driver_not_the_toolkit(tmp_path, monkeypatch):
    assert installed.ASCEND_DRIVER == Path("/usr/local/Ascend/driver")
    driver = write(tmp_path / "driver" / "version.info", "Version=24.1.rc3\nascendhal_version=7.35.23\n").parent
    toolkit = tmp_path / "ascend-toolkit" / "latest"
    for arch in ("x86_64", "aarch64"):
        write(toolkit / f"{arch}-linux" / "ascend_toolkit_install.info", "package_name=cann-toolkit\nversion=9.1.0\n")
    # CANN's set_env.sh: ASCEND_HOME_PATH is the toolkit; the old doctor read $ASCEND_HOME_PATH/driver and found none
    monkeypatch.setenv("ASCEND_HOME_PATH", str(toolkit))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert driver_version(driver) == "24.1.rc3" and cann_version() == "9.1.0"
    assert driver_version(tmp_path / "no-driver") is None
    assert key_value_file(tmp_path / "missing.info", "version") is None


# ---------------------------------------------------------------- doctor on a simulated NPU machine

def _simulate(monkeypatch, tmp_path, mindspeed: str, mbridge: str, stack: str = "vllm-ascend-0.23.0"):
    from harness.cli import doctor_cmd
    from harness.config import hardware as hw
    from harness.config.stacks import get_stack

    versions = {p.name: p.reports or p.version for p in get_stack(stack).pins}  # what importlib.metadata says
    roots = {"mindspeed": mindspeed_tree(tmp_path, mindspeed), "mbridge": mbridge_tree(tmp_path, mbridge)}
    have = {**dict.fromkeys(doctor_cmd.DOCTOR_PACKAGES), **versions}
    monkeypatch.setattr(doctor_cmd, "installed_stack", lambda: have)
    monkeypatch.setattr(installed, "package_root", roots.get)
    monkeypatch.setattr(hw, "detect", lambda: hw.Detected("npu", hw.PROFILES["a3"], 16, "Ascend910_9391"))


def test_doctor_calls_v230_and_fixed_mbridge_supported(monkeypatch, tmp_path, capsys):
    from harness.cli import main

    _simulate(monkeypatch, tmp_path, "2.3.0", "10cb17f")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "SUPPORTED: this machine runs the vllm-ascend-0.23.0 stack", out
    # router replay (R3) breaks on megatron-core 0.12.1 whatever MindSpeed and mbridge are (an optional feature the
    # DAPO recipe leaves off): nothing else may
    assert not [line for line in out.splitlines() if "BREAK" in line and "router replay" not in line], out


def test_doctor_names_the_scale_bug_of_v220(monkeypatch, tmp_path, capsys):
    from harness.cli import main

    _simulate(monkeypatch, tmp_path, "2.2.0", "10cb17f")
    assert main(["doctor", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["stack"]["name"] == "vllm-ascend-0.23.0" and not doc["passed"] and doc["state"] == "UNSUPPORTED"
    (wrong,) = doc["stack"]["mismatches"]
    assert wrong.startswith("mindspeed 0.12.1: seed 001's MLA softmax scale") and "2.3.0_core_r0.12.1" in wrong
    found = doc["detected"]["mindspeed"]
    assert found["present"] is True and "scale=0.125" in found["detail"]
    ms = next(r for r in doc["suites"] if "MindSpeed" in r["area"])
    assert ms["verdict"] == "break" and "scale=0.125" in ms["reason"]


@pytest.mark.parametrize("commit", ["v0.15.1", "680253f"])
def test_doctor_names_unfixed_mbridge(monkeypatch, tmp_path, capsys, commit):
    from harness.cli import main

    _simulate(monkeypatch, tmp_path, "2.3.0", commit)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "differs: mbridge 0.15.1: the DeepSeek-V3 bridge cannot read rope_theta" in out
    assert out.strip().splitlines()[-1].startswith("UNSUPPORTED: 1 difference(s) from the vllm-ascend-0.23.0 stack")


def test_doctor_without_the_source_says_it_cannot_tell(monkeypatch, tmp_path, capsys):
    from harness.cli import main

    _simulate(monkeypatch, tmp_path, "2.3.0", "10cb17f")
    monkeypatch.setattr(installed, "package_root", lambda name: None)
    assert main(["doctor"]) == 1
    assert "could not tell it from the source with seed 001's MLA softmax scale" in capsys.readouterr().out


def test_predictions_need_no_bug_table_on_cpu():
    from harness.cli.doctor_cmd import predict_suites

    assert all(r["verdict"] == "skip" for r in predict_suites("cpu", {}))

