"""MLA math and checks: closed-form softmax scale, absorbed-weight derivation, freshness, aliasing, behaviour.

Two bugs broke 671B DAPO on Ascend (seed 001):
1. vllm-ascend derived the absorbed decode weights W_UK_T / W_UV from `kv_b_proj` with `.contiguous()`
   (copies). verl syncs new weights into `kv_b_proj` in place and never re-runs
   `process_weights_after_loading`, so W_UK_T / W_UV stayed at their (dummy) initial values and rollouts
   were gibberish (fixed by re-deriving after every sync: verl PR #4130, lost in v0.7.0's async path,
   restored by #5235). Upstream vLLM derives them as views, so an in-place sync updates them.
2. MindSpeed's MLA used 1/sqrt(128) (kv_channels) instead of 1/sqrt(192) * mscale^2 as softmax scale.

Layouts follow vLLM's `MLAAttention.process_weights_after_loading`: kv_b_proj.weight is
[N*(P+V), L]; W_UK_T is [N, P, L]; W_UV is [N, L, V] (N heads, P qk_nope, V v_head, L kv_lora_rank).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.models import ModelSpec, yarn_mscale


# ---------------------------------------------------------------- softmax scale
def softmax_scale(spec: ModelSpec) -> float:
    """The MLA softmax scale: (qk_nope + qk_rope)^-0.5 * mscale^2 (yarn) — 0.1352338 for DSV3, 192^-0.5 for
    Moonlight. DeepSeek's yarn scales the scores by mscale(factor, mscale_all_dim)^2 (HF `yarn_apply_mscale`,
    vLLM `DeepseekV2MLAAttention`)."""
    scale = spec.qk_head_dim ** -0.5
    rope = spec.rope_scaling
    if rope is not None and rope.mscale_all_dim:
        m = yarn_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return scale


def wrong_scales(spec: ModelSpec) -> dict[str, float]:
    """The scales real bugs used: MindSpeed's 1/sqrt(kv_channels = v_head_dim), and the yarn scale without mscale^2."""
    return {"v_head_dim": spec.v_head_dim ** -0.5, "no_mscale": spec.qk_head_dim ** -0.5}


@dataclass(frozen=True)
class ScaleFinding:
    """Engine scale vs the closed form; `ok` within `rtol`; `bug` names the known wrong scale it equals, if any."""

    engine: str
    model: str
    expected: float
    actual: float
    rtol: float
    bug: str | None = None

    @property
    def rel_error(self) -> float:
        return abs(self.actual - self.expected) / abs(self.expected)

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.rtol

    def message(self) -> str:
        hint = f" (= the {self.bug} bug)" if self.bug else ""
        return (f"{self.engine}: softmax scale {self.actual:.7f}{hint} != closed form {self.expected:.7f} for "
                f"{self.model} (qk_head_dim^-0.5 * mscale^2); relative error {self.rel_error:.3%} > {self.rtol:.1e}")


def check_scale(engine_name: str, spec: ModelSpec, actual: float, rtol: float = 1e-6) -> ScaleFinding:
    """Compare an engine's softmax scale with the closed form for `spec`."""
    bug = next((name for name, v in wrong_scales(spec).items() if math.isclose(actual, v, rel_tol=1e-6)), None)
    return ScaleFinding(engine=engine_name, model=spec.name, expected=softmax_scale(spec), actual=float(actual),
                        rtol=rtol, bug=bug)


# ---------------------------------------------------------------- tolerances (data)
@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# Per-dtype tolerances for comparing derived weights and outputs (torch.testing.assert_close defaults for
# weights; outputs accumulate over layers, so they get wider bands).
WEIGHT_TOL: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(rtol=1.3e-6, atol=1e-5),
    torch.float16: Tolerance(rtol=1e-3, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-5),
}
LOGPROB_TOL: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(rtol=1e-4, atol=2e-4),
    torch.float16: Tolerance(rtol=1e-2, atol=2e-2),
    torch.bfloat16: Tolerance(rtol=5e-2, atol=1e-1),
}


def tolerance(table: dict[torch.dtype, Tolerance], dtype: torch.dtype) -> Tolerance:
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {dtype}; known: {', '.join(map(str, table))}") from None


# ---------------------------------------------------------------- absorbed weights
def derive_absorbed(kv_b_weight: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_UK_T [N,P,L], W_UV [N,L,V]) as VIEWS of kv_b_proj.weight [N*(P+V), L], exactly as upstream vLLM's
    `split_kv_b_proj` + `process_weights_after_loading` (`.T.view(L, N, P+V).split`, no copy)."""
    n, p, v, lat = spec.num_attention_heads, spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
    w = kv_b_weight.T
    if tuple(w.shape) != (lat, n * (p + v)):
        raise ValueError(f"kv_b_proj weight {tuple(kv_b_weight.shape)} does not match {spec.name}: "
                         f"expected {(n * (p + v), lat)}")
    w_uk, w_uv = w.view(lat, n, p + v).split([p, v], dim=-1)
    return w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)
