"""The two MLA prefill paths of seed 001, as real code running HF DeepseekV3Attention.

* vanilla: transformers' eager attention with an additive mask built the way a small-operator
  prefill builds it: a [b, 1, 1, s] padding mask plus a causal [s, s] mask. Adding it to the scores
  broadcasts over heads and materializes [b, h, s, s] (plus a float32 softmax copy and a bf16 cast):
  the OOM seed 001 hit at GBS 128 when vllm-ascend's MLA prefill took the vanilla branch.
* chunked: the same MLA math over query chunks of `prefill_chunk` tokens (what
  `chunk_prefill_for_mla` / chunked prefill bounds): scores are [b, h, chunk, s] at most, the causal
  mask is built per chunk and the padding mask is only broadcast chunk by chunk.

Both run through `DeepseekV3Attention.forward` (projections, yarn rope, kv_b expansion, o_proj are
the model's own); only the attention core differs, registered as a transformers attention function.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from harness.config.models import ModelSpec
from harness.config.scales import Scale
from harness.findings import Finding
from harness.memory.phases import GiB, MemoryOptions, budget_bytes, plan_memory, prefill_shape
from harness.memory.tracer import Allocation, Trace, fake_mode, rope_inputs, shard_config, trace

CHUNKED = "harness_chunked_prefill"
VANILLA = "eager"  # transformers' own eager attention: matmul, + mask, softmax(fp32), cast, matmul
DEFAULT_CHUNK = 512


def chunked_prefill_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                              prefill_chunk: int = DEFAULT_CHUNK, **_):
    """Causal attention over query chunks; `attention_mask` is the [b, 1, 1, s] additive padding mask
    (or None). Returns ([b, s, h, v], None) like transformers' attention functions."""
    b, h, s, _ = query.shape
    out = query.new_empty(b, s, h, value.shape[-1])
    for start in range(0, s, prefill_chunk):
        end = min(start + prefill_chunk, s)
        # Keys past the chunk's last query are all masked: compute scores only up to `end`.
        scores = torch.matmul(query[:, :, start:end], key[:, :, :end].transpose(2, 3)) * scaling
        allowed = torch.ones(end - start, end, dtype=torch.bool, device=query.device).tril(start)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if attention_mask is not None:
            scores = scores + attention_mask[..., :end]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        del scores
        out[:, start:end] = torch.matmul(probs, value[:, :, :end]).transpose(1, 2)
        del probs  # else the previous chunk's probabilities live on through the next chunk's softmax
    return out, None


def register_attention(name: str, fn) -> None:
    """Make `fn` selectable as `config._attn_implementation = name` (transformers' AttentionInterface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, fn)


register_attention(CHUNKED, chunked_prefill_attention)


def padding_mask(lengths: torch.Tensor, seq: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive [b, 1, 1, s] mask: 0 where a key is a real token, -inf on left padding."""
    keys = torch.arange(seq, device=lengths.device)
    pad = keys.unsqueeze(0) < (seq - lengths).unsqueeze(1)
    return torch.zeros(pad.shape, dtype=dtype, device=lengths.device).masked_fill(pad, float("-inf"))[:, None, None, :]


def vanilla_mask(pad: torch.Tensor) -> torch.Tensor:
    """The vanilla path's mask: padding [b, 1, 1, s] + causal [s, s] -> [b, 1, s, s]."""
    s = pad.shape[-1]
    causal = torch.full((s, s), float("-inf"), dtype=pad.dtype, device=pad.device).triu(1)
    return pad + causal


def run_prefill(attn, hidden: torch.Tensor, cos_sin, pad: torch.Tensor, *, variant: str,
                chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """One MLA prefill of `attn` (a DeepseekV3Attention) on left-padded `hidden` [b, s, d].

    variant: "vanilla" or "chunked", or the name of any registered attention function that takes
    the padding mask and `prefill_chunk` (the seeded-bug self-tests register their own)."""
    impl = {"vanilla": VANILLA, "chunked": CHUNKED}.get(variant, variant)
    attn.config._attn_implementation = impl
    mask = vanilla_mask(pad) if impl == VANILLA else pad
    out, _ = attn(hidden, position_embeddings=cos_sin, attention_mask=mask, prefill_chunk=chunk)
    return out


def trace_prefill(spec: ModelSpec, *, batch: int, seq: int, tp: int = 1, variant: str = "chunked",
                  chunk: int = DEFAULT_CHUNK, layer: int = 0) -> Trace:
    """Per-device peak of one MLA prefill at real shapes on fake tensors: `batch` prompts of `seq`
    tokens, heads split by `tp` (the rollout's tensor parallel)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    with fake_mode(), torch.no_grad():
        cfg = shard_config(spec, tp=tp)
        attn = DeepseekV3Attention(cfg, layer).eval()
        hidden = torch.empty(batch, seq, spec.hidden_size)
        cos_sin = rope_inputs(cfg, batch, seq)
        pad = torch.zeros(batch, 1, 1, seq)
        return trace(lambda: run_prefill(attn, hidden, cos_sin, pad, variant=variant, chunk=chunk),
                     resident=(attn, hidden, pad, *cos_sin), name=f"prefill-{variant}")


@dataclass(frozen=True)
class PrefillVerdict:
    """Does one device's prefill fit, and did it materialize a full [b, h, s, s] buffer?"""

    variant: str
    peak_gib: float  # static (weights, KV pool, HCCL) + the traced prefill peak
    budget_gib: float
    headroom_gib: float
    quadratic: tuple[Allocation, ...]  # among the trace's largest allocations, those with >= b*h*s*s elements

    @property
    def fits(self) -> bool:
        return self.peak_gib + self.headroom_gib <= self.budget_gib

    @property
    def ok(self) -> bool:
        return self.fits and not self.quadratic

    def message(self) -> str:
        parts = [f"{self.variant} prefill peak {self.peak_gib:.2f} GiB + headroom {self.headroom_gib:.1f} "
                 f"{'<=' if self.fits else '>'} budget {self.budget_gib:.1f} GiB"]
        if self.quadratic:
            worst = self.quadratic[0]
            parts.append(f"{len(self.quadratic)} allocation(s) span the full [b,h,s,s] score matrix, worst "
                         f"{worst.op} {list(worst.shape)} {worst.dtype} {worst.nbytes / 2**30:.2f} GiB")
        return "; ".join(parts)

    def findings(self) -> tuple[Finding, ...]:
        metric = f"{self.quadratic[0].op} [b,h,s,s]" if self.quadratic else "prefill peak"
        return () if self.ok else (Finding("memory.prefill", metric, f"{self.variant} prefill", self.message()),)


def check_prefill(tr: Trace, *, batch: int, heads: int, seq: int, static_bytes: float, budget_bytes: float,
                  headroom_gib: float) -> PrefillVerdict:
    """Verdict on a traced prefill: peak = static + traced activation peak against the budget, and every
    allocation as large as the broadcast [b, h, s, s] mask/scores (seed 001's MLA prefill OOM)."""
    full = batch * heads * seq * seq
    quadratic = tuple(a for a in tr.largest if math.prod(a.shape) >= full)
    return PrefillVerdict(tr.name.removeprefix("prefill-"), (static_bytes + tr.activation_peak_bytes) / 2**30,
                          budget_bytes / 2**30, headroom_gib, quadratic)


def prefill_step_tokens(prompts: int, prompt_len: int, token_budget: int | None) -> int:
    """Tokens one prefill step computes: the whole batch, or at most vLLM's per-step budget
    (`max_num_batched_tokens`) when chunked prefill is on (the scheduler splits the prompts into steps)."""
    total = prompts * prompt_len
    return total if token_budget is None else min(total, token_budget)


def prefill_query_bytes(spec: ModelSpec, tokens: int, dtype_bytes: int = 2) -> int:
    """The query tensor [tokens, heads, qk_head_dim] any MLA prefill step of `tokens` tokens allocates: a floor
    under the step's transient peak. A measured peak below it did not see the prefill (the sensitivity guard of
    suites/memory/test_chunked_prefill.py), so its bound is the step's tokens, never the whole batch's: a chunked
    run of 4 x 2048 tokens at a 2048-token budget holds 96 MiB of DSV3 bf16 query per step, not 384 MiB."""
    return tokens * spec.num_attention_heads * spec.qk_head_dim * dtype_bytes


def prefill_verdict(scale: Scale, options: MemoryOptions, *,
                    variant: str | None = None) -> PrefillVerdict:
    """Trace the rollout prefill of `scale` on one device at the shape the memory model derives (prompts
    per step, prompt length, heads / rollout TP) and judge it against the device with the model's
    weights, KV pool and HCCL memory around it. `variant` defaults to the options' chunked_prefill."""
    o = options.resolve(scale)
    if variant is not None:
        o = dataclasses.replace(o, chunked_prefill=variant != "vanilla")
    variant = variant or ("chunked" if o.chunked_prefill else "vanilla")
    prompts, seq, chunk = prefill_shape(scale, o)
    tp = scale.plan.rollout.tp
    tr = trace_prefill(scale.model, batch=prompts, seq=seq, tp=tp, variant=variant, chunk=chunk or seq)
    (phase,) = plan_memory(scale, o, phases=("prefill",))
    static = (phase.peak_gib - phase.components["activations"]) * GiB
    return check_prefill(tr, batch=prompts, heads=scale.model.num_attention_heads // tp, seq=seq,
                         static_bytes=static, budget_bytes=budget_bytes(scale), headroom_gib=phase.headroom_gib)

