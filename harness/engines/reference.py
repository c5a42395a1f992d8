"""Reference MLA rollout engine: pure torch, written from the DeepSeek-V3 equations; the numeric golden at tiny
shapes and the engine the tiny DAPO lab rolls out with.

It behaves like upstream vLLM where the MLA bugs live:
- the KV cache holds the compressed latent [c_kv (kv_lora_rank) | rotated k_pe (qk_rope_head_dim)];
- prefill is the naive path (k_nope / v expanded through kv_b_proj directly, as vLLM's MHA prefill);
- decode is the absorbed path: q_nope @ W_UK_T scores against the latent, the latent output goes through W_UV;
- W_UK_T / W_UV are derived ONCE, after the initial load (`_process_weights_after_loading`), as views of
  kv_b_proj.weight (`harness.derive_absorbed`); `load_weights` copies in place, so views stay fresh.
So a stale W_UV corrupts decode tokens only; the first generated token (from prefill) stays right.
"""
from __future__ import annotations

import enum
import functools
import math
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.config.models import ModelSpec
from harness.engines.base import Engine, MLALayer, Rollout, torch_threads
from harness.engines.weights import checkpoint_shapes, read_model_dir
from harness.errors import BadInput
from harness.mla.derive import derive_absorbed, misderive_absorbed, softmax_scale


class EngineFault(str, enum.Enum):
    """Real bugs the reference engine can reproduce (`ReferenceEngine(..., fault=EngineFault.STALE_COPY)` or the
    string).

    STALE_COPY      vllm-ascend: W_UK_T / W_UV made with `.contiguous()` at init and never re-derived after a
                    weight sync (seed 001 精度问题1; verl PR #4130 / #5235). Decode uses the initial weights.
    DTYPE_COPY      W_UK_T / W_UV cast to another dtype (float64 here) at init: a cast is a copy, stale after sync
                    (the dequant / NPU-format-cast variant of the same bug).
    REBIND          `load_weights` rebinds `param.data = new` instead of copying in place: kv_b_proj moves to new
                    storage and the W_UK_T / W_UV views keep pointing at the old one.
    SCALE_V_HEAD    MindSpeed MLA: softmax scale 1/sqrt(v_head_dim) (kv_channels 128) instead of
                    1/sqrt(qk_nope + qk_rope) * mscale^2 (seed 001 精度问题2).
    SCALE_NO_MSCALE softmax scale 1/sqrt(qk_head_dim) without the yarn mscale^2 factor.
    Realistic variants that slipped through single-sync, list-input, token-only suites:
    REDERIVE_ONCE   copies re-derived after the FIRST `load_weights` only (verl #4130's fix half done).
    TWO_PASS        copies; `load_weights` iterates its input twice (load, then find the layers to re-derive):
                    a one-shot generator, as verl passes, is empty the second time, so nothing is re-derived.
    HIDDEN_COPY     decode uses packed copies made at init and never re-derived, while `mla_layers()` shows the
                    fresh views (a pre-packed / format-cast kernel copy): only the outputs can show it.
    DROP_KV_A       `load_weights` silently drops kv_a_proj_with_mqa (a broken fused-weight mapping).
    PRECISION       copies re-derived after every sync, but rounded through bf16 in an fp32 engine.
    LAYOUT          fresh views of kv_b_proj with the per-head rows split [v | nope] instead of [nope | v].
    DECODE_SCALE    `softmax_scale()` and prefill use the right scale, the decode kernel 1/sqrt(v_head_dim).
    MoE faults (each invisible to a model whose layers are all dense):
    PACKED_EXPERTS  the routed experts compute from a copy packed when the engine was built, never refreshed by a
                    sync (vLLM CPU's MoE prepack skipped on a reload; an NPU format cast), while `synced_weights()`
                    shows the fresh parameters: only the outputs can show it.
    STALE_ROUTER_BIAS  `load_weights` skips `e_score_correction_bias` (a buffer in transformers: a sync of
                    `named_parameters()` alone never sends it), so expert choices follow the initial bias.
    PLAIN_TOPK      the router takes a plain top-k over all experts instead of DeepSeek's group-limited top-k (the
                    best `topk_group` of `n_group` groups first): a kernel or port that ignores n_group / topk_group.
    BIASED_WEIGHTS  the gating weights are gathered from the bias-corrected choice scores (sigmoid +
                    e_score_correction_bias) instead of the plain sigmoid scores: the bias is meant for the choice only.
    STALE_ROUTER_FP32  the router computes from an fp32 copy of gate.weight made once at build (`.float()`): a no-op
                    alias in an fp32 engine, a copy that no sync refreshes in a bf16 one.
    DUMMY_EXPERTS   built with load_format="dummy" (verl's flow), the engine never sets up its routed-expert weight
                    loader (the real loader does), so every sync drops the routed experts silently and they stay at
                    their dummy init; a real build is right.
    STALE_EXPERT_MAP  the routed experts live in physical slots through a logical-to-physical map (vLLM's EP
                    `expert_map`, vllm-ascend's EPLB `log2phy`); a wake-up after sleep level 2 re-places them (here
                    each slot moves one expert on within its EP-rank half) and the engine keeps the map from before
                    the sleep, so every later sync writes each expert into its neighbour's slot (verl#7086:
                    `expert_ids_per_ep_rank` stale after sleep level 2 with EP > 1; vllm-ascend#12226: `log2phy`
                    not restored on wake). Right before the first level-2 sleep, right without one.
    SPLIT_K         layer 0's o_proj is a split-K GEMM whose split count follows the batch size (the cuBLAS split-K
                    batch variance vLLM's batch-invariant mode turns off): the same prompt's log-probs change in
                    their last bits with the batch it runs in.
    Across sleep the copies behave as in vLLM's sleep pool: level 1 restores them (still the initial weights),
    level 2 discards them and wakes them zeroed, and no sync re-derives them, so they stay stale either way.
    """

    STALE_COPY = "stale_copy"
    DTYPE_COPY = "dtype_copy"
    REBIND = "rebind"
    SCALE_V_HEAD = "scale_v_head"
    SCALE_NO_MSCALE = "scale_no_mscale"
    REDERIVE_ONCE = "rederive_once"
    TWO_PASS = "two_pass"
    HIDDEN_COPY = "hidden_copy"
    DROP_KV_A = "drop_kv_a"
    PRECISION = "precision"
    LAYOUT = "layout"
    DECODE_SCALE = "decode_scale"
    PACKED_EXPERTS = "packed_experts"
    STALE_ROUTER_BIAS = "stale_router_bias"
    SPLIT_K = "split_k"
    PLAIN_TOPK = "plain_topk"
    BIASED_WEIGHTS = "biased_weights"
    STALE_ROUTER_FP32 = "stale_router_fp32"
    DUMMY_EXPERTS = "dummy_experts"
    STALE_EXPERT_MAP = "stale_expert_map"


# Faults whose absorbed weights are copies the engine re-derives itself after a sync (correctly or not).
_REDERIVING = {EngineFault.REDERIVE_ONCE, EngineFault.TWO_PASS, EngineFault.PRECISION}


def yarn_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """DeepSeek YaRN inverse frequencies for the rope dims (DeepSeek-V3 `yarn_find_correction_range` + linear ramp)."""
    dim, base = spec.qk_rope_head_dim, spec.rope_theta
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    rope = spec.rope_scaling
    if rope is None or rope.factor <= 1:
        return freq

    def correction_dim(rotations: float) -> float:
        return dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return freq / rope.factor * (1 - extrapolation) + freq * extrapolation


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of `storage`'s bytes (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


_CHUNK = 8 * 2**20


def _transfer(storage: torch.UntypedStorage, file, *, write: bool) -> None:
    """Copy `storage`'s bytes to (write) or from `file` through a bounce buffer: `Tensor.numpy()` on the
    storage itself would mark it non-resizable for good, and sleep must resize it."""
    data = _bytes_of(storage)
    bounce = torch.empty(min(_CHUNK, len(data)), dtype=torch.uint8)
    buf = bounce.numpy()
    for start in range(0, len(data), _CHUNK):
        n = min(_CHUNK, len(data) - start)
        if write:
            bounce[:n].copy_(data[start:start + n])
            file.write(buf[:n])
        elif file.readinto(buf[:n]) != n:
            raise RuntimeError("reference engine: sleep offload file truncated")
        else:
            data[start:start + n].copy_(bounce[:n])


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek's interleaved rope: pairs (x0, x1), (x2, x3), ... rotate by one angle each. The output lays the
    rotated pairs out as [evens | odds]; q and k get the same layout, so dot products are unchanged."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class ReferenceEngine(Engine):
    """Pure-torch DeepSeek-V3 MLA rollout engine (see module docstring).

    ReferenceEngine(spec, weights=None, load_format="real", dtype=torch.float32, seed=0, fault=None)
      weights      dict name -> tensor (HF checkpoint names) or a model directory; required for "real".
      load_format  "real" loads `weights`; "dummy" initialises uniform(-1e-3, 1e-3) from `seed` like vLLM's dummy
                   loader, to be overwritten by `load_weights` (the verl flow with load_format=dummy).
      fault        None, or a `EngineFault` (or its string value) reproducing a real bug, for seeded self-tests and the
                   tiny DAPO lab's fault injection.
      return_routed_experts  fill `Rollout.routed_experts` (vLLM's layout, harness.engines.base.Rollout).
      batch_invariant  decode every sequence of a batch on its own (one row per GEMM), so a prompt's tokens and
                   log-probs are bit-equal whatever batch it runs in (prefill is per prompt already): the claim the
                   batch-invariance suite judges (`Engine.batch_invariant`).
    Supports sleep(level=1|2) / wake_up() for real (see `sleep`): the weights' storage is freed while asleep and
    reallocated in place on wake-up, so views into it (W_UK_T / W_UV) stay valid, as vLLM's CuMemAllocator /
    vllm-ascend's CaMemAllocator remap the pool at the same virtual addresses.
    """

    supports_sleep = True
    num_threads = 1  # torch threads while sampling: tiny shapes are fastest, and load-proof, on one (torch_threads)

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor] | str | Path | None = None, *,
                 load_format: str = "real", dtype: torch.dtype = torch.float32, seed: int = 0,
                 fault: EngineFault | str | None = None, batch_invariant: bool = False,
                 return_routed_experts: bool = False):
        self.spec, self.dtype, self.batch_invariant = spec, dtype, batch_invariant
        self.return_routed_experts = return_routed_experts
        self._capture: dict[int, torch.Tensor] | None = None  # layer -> expert ids [T, top_k] of the forward running
        self._batch_rows = 1  # rows of the current `sample` call (SPLIT_K's split count)
        self.fault = EngineFault(fault) if fault is not None else None
        self.name = "reference" + (f"[{self.fault.value}]" if self.fault else "")
        # DUMMY_EXPERTS: a dummy build never sets up the routed-expert loader, so syncs drop those weights
        self._drops_experts = self.fault is EngineFault.DUMMY_EXPERTS and load_format == "dummy"
        self._asleep = False
        self._stale_expert_map = False  # STALE_EXPERT_MAP: set by a wake-up after sleep level 2
        self._pool: list[torch.UntypedStorage] = []  # storages released while asleep (see sleep)...
        self._pool_nbytes: list[int] = []  # ...and their sizes, to reallocate on wake-up
        self._offload = None  # level 1: the unlinked file holding the pool's bytes
        self.params: dict[str, torch.nn.Parameter] = {}
        gen = torch.Generator().manual_seed(seed)
        for pname, shape in checkpoint_shapes(spec).items():
            t = torch.empty(shape, dtype=torch.float32).uniform_(-1e-3, 1e-3, generator=gen)
            self.params[pname] = torch.nn.Parameter(t.to(dtype), requires_grad=False)
        if load_format == "real":
            if weights is None:
                raise BadInput("ReferenceEngine(load_format='real') needs weights (a state dict or a model directory)")
            state = read_model_dir(weights) if isinstance(weights, (str, Path)) else weights
            missing = sorted(set(self.params) - set(state))
            if missing:
                raise BadInput(f"weights for {spec.name} lack {len(missing)} tensors, first {missing[0]!r}")
            self._copy_in(state.items(), rebind=False)
        elif load_format != "dummy":
            raise BadInput(f"load_format {load_format!r}: use 'real' or 'dummy'")
        self._inv_freq = yarn_inv_freq(spec)
        self._scale = {
            EngineFault.SCALE_V_HEAD: spec.v_head_dim ** -0.5,
            EngineFault.SCALE_NO_MSCALE: spec.qk_head_dim ** -0.5,
        }.get(self.fault, softmax_scale(spec))
        self._decode_scale = spec.v_head_dim ** -0.5 if self.fault is EngineFault.DECODE_SCALE else self._scale
        self._syncs = 0
        self._process_weights_after_loading()
        # PACKED_EXPERTS: the experts' kernel copy, made once at build (see EngineFault)
        self._packed_experts = {n: p.detach().clone() for n, p in self.params.items() if ".mlp.experts." in n} \
            if self.fault is EngineFault.PACKED_EXPERTS else {}
        # STALE_ROUTER_FP32: the router's fp32 copy, made once (an alias of the parameter when it is fp32 already)
        self._router_fp32 = {n: p.data.float() for n, p in self.params.items() if n.endswith("mlp.gate.weight")} \
            if self.fault is EngineFault.STALE_ROUTER_FP32 else {}

    # ------------------------------------------------------------ weights
    def _process_weights_after_loading(self) -> None:
        """Derive W_UK_T / W_UV once, as vLLM does at engine init (verl never calls it again after a sync)."""
        self._absorbed = [self._derive(i) for i in range(self.spec.num_hidden_layers)]
        # HIDDEN_COPY: the kernel's own packed copies, which mla_layers() does not show
        self._packed = [(a.clone(), b.clone()) for a, b in self._absorbed] if self.fault is EngineFault.HIDDEN_COPY \
            else None

    def _derive(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv_b = self.params[f"model.layers.{i}.self_attn.kv_b_proj.weight"]
        if self.fault is EngineFault.LAYOUT:
            return misderive_absorbed(kv_b, self.spec)["v_first"]
        w_uk_t, w_uv = derive_absorbed(kv_b, self.spec)
        if self.fault in (EngineFault.STALE_COPY, *_REDERIVING):
            w_uk_t, w_uv = w_uk_t.contiguous(), w_uv.contiguous()
        elif self.fault is EngineFault.DTYPE_COPY:
            w_uk_t, w_uv = w_uk_t.to(torch.float64), w_uv.to(torch.float64)
        if self.fault is EngineFault.PRECISION:
            w_uk_t, w_uv = (w.to(torch.bfloat16).to(self.dtype) for w in (w_uk_t, w_uv))
        return w_uk_t, w_uv

    def _copy_in(self, weights: Iterable[tuple[str, torch.Tensor]], *, rebind: bool) -> None:
        with torch.no_grad():
            for pname, tensor in weights:
                if self.fault is EngineFault.DROP_KV_A and "kv_a_proj_with_mqa" in pname:
                    continue
                if self._drops_experts and ".mlp.experts." in pname:
                    continue
                if self._stale_expert_map:
                    pname = self._slot_by_stale_map(pname)
                param = self.params.get(pname)
                if param is None:
                    raise BadInput(f"load_weights: unknown weight {pname!r} for {self.spec.name}")
                if tuple(tensor.shape) != tuple(param.shape):
                    raise BadInput(f"load_weights: {pname} has shape {tuple(tensor.shape)}, "
                                   f"expected {tuple(param.shape)}")
                if rebind:
                    param.data = tensor.detach().to(self.dtype).clone()
                else:
                    param.copy_(tensor)

    def _slot_by_stale_map(self, pname: str) -> str:
        """STALE_EXPERT_MAP: where the map from before the level-2 sleep sends routed expert e after the re-placement
        (its neighbour within its EP-rank half)."""
        m = re.search(r"\.mlp\.experts\.(\d+)\.", pname)
        if not m:
            return pname
        half = self.spec.n_routed_experts // 2
        e = int(m.group(1))
        slot = (e // half) * half + (e + 1) % half
        return f"{pname[:m.start(1)]}{slot}{pname[m.end(1):]}"

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._check_awake("load_weights")
        self._syncs += 1
        if self.fault is EngineFault.STALE_ROUTER_BIAS:
            weights = ((n, t) for n, t in weights if not n.endswith("e_score_correction_bias"))
        if self.fault not in _REDERIVING:
            self._copy_in(weights, rebind=self.fault is EngineFault.REBIND)
            return
        # TWO_PASS iterates the input itself twice: a one-shot generator (verl's) is empty the second time
        weights = weights if self.fault is EngineFault.TWO_PASS else list(weights)
        self._copy_in(weights, rebind=False)
        touched = {int(n.split(".")[2]) for n, _ in weights if n.endswith("kv_b_proj.weight")}
        if self.fault is not EngineFault.REDERIVE_ONCE or self._syncs == 1:
            for i in touched:  # re-derive the copies of the layers this sync reached (verl #4130)
                self._absorbed[i] = self._derive(i)

    def mla_layers(self) -> list[MLALayer]:
        return [MLALayer(layer=i, kv_b_proj=self.params[f"model.layers.{i}.self_attn.kv_b_proj.weight"].data,
                         w_uk_t=w_uk_t, w_uv=w_uv) for i, (w_uk_t, w_uv) in enumerate(self._absorbed)]

    def softmax_scale(self) -> float:
        return self._scale

    def synced_weights(self) -> dict[str, torch.Tensor]:
        return {k: p.data for k, p in self.params.items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's current weights by checkpoint name (live tensors, do not modify)."""
        self._check_awake("state_dict")
        return {k: p.data for k, p in self.params.items()}

    # ------------------------------------------------------------ sleep mode
    def _weight_storages(self) -> list[torch.UntypedStorage]:
        """Every distinct storage the weights live in: the parameters', plus W_UK_T / W_UV's where they are not
        views of kv_b_proj (the STALE_COPY / DTYPE_COPY copies, or REBIND's orphaned old kv_b_proj storage):
        vLLM allocates those in the same sleep pool, so they are released and restored with the weights."""
        tensors = [*self.params.values(), *(w for pair in self._absorbed for w in pair)]
        unique: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes():
                unique.setdefault(storage.data_ptr(), storage)
        return list(unique.values())

    def sleep(self, level: int = 1) -> None:
        """Free the weights' memory until `wake_up`, as vLLM's sleep mode does (seed 001).

        level 1 offloads: the weight bytes go to host storage and the engine's copy is freed. On this CPU-only
          engine the engine's memory already is host RAM, so a host copy would keep the same bytes resident;
          the offload target is an unlinked temporary file instead (the page cache, outside the process's
          resident set, standing for pinned host RAM outside device memory).
        level 2 discards the weights: their storage is freed; `wake_up` reallocates it zeroed, and the next
          weight sync (`load_weights`) refills it, the verl flow.
        Storage is freed with `untyped_storage().resize_(0)`, so every tensor (and view) keeps its storage
        object and sees the reallocated bytes after wake-up. The KV cache lives only inside one `sample` call
        here (allocated per rollout and freed on return), so there is none to drop at either level.
        """
        if level not in (1, 2):
            raise ValueError(f"sleep level {level}: use 1 (offload) or 2 (discard weights)")
        self._check_awake("sleep")
        self._pool = self._weight_storages()
        if level == 1:
            # open until wake_up reads it back (or the engine is collected): unlinked, so never left on disk
            self._offload = tempfile.TemporaryFile(prefix="reference-engine-offload-")  # noqa: SIM115
            for storage in self._pool:
                _transfer(storage, self._offload, write=True)
            self._offload.flush()
        self._pool_nbytes = [storage.nbytes() for storage in self._pool]
        for storage in self._pool:
            storage.resize_(0)
        self._asleep = True

    def wake_up(self) -> None:
        """Reallocate the weights in place: restored from the offload file after level 1, zeroed after level 2
        (sync them with `load_weights`)."""
        if not self._asleep:
            return
        if self._offload is not None:
            self._offload.seek(0)
        else:  # after level 2 the experts are re-placed; STALE_EXPERT_MAP keeps the map from before
            self._stale_expert_map |= self.fault is EngineFault.STALE_EXPERT_MAP
        for storage, nbytes in zip(self._pool, self._pool_nbytes, strict=True):
            storage.resize_(nbytes)
            if self._offload is None:
                _bytes_of(storage).zero_()
            else:
                _transfer(storage, self._offload, write=False)
        if self._offload is not None:
            self._offload.close()
        self._pool, self._pool_nbytes, self._offload = [], [], None
        self._asleep = False

    def _check_awake(self, what: str) -> None:
        if self._asleep:
            raise RuntimeError(f"{self.name} is asleep: call wake_up() before {what} "
                               "(and load_weights after sleep level 2)")

    # ------------------------------------------------------------ model
    def _p(self, name: str) -> torch.Tensor:
        return self._packed_experts.get(name, self.params[name]) if self._packed_experts else self.params[name]

    def _o_proj(self, i: int, out: torch.Tensor) -> torch.Tensor:
        w = self._p(f"model.layers.{i}.self_attn.o_proj.weight")
        if self.fault is not EngineFault.SPLIT_K or i != 0 or self._batch_rows == 1:
            return F.linear(out, w)
        # split-K with as many splits as the batch has rows: other partial sums, other rounding
        chunks = torch.arange(w.shape[1]).chunk(self._batch_rows)
        return sum(F.linear(out[..., c], w[:, c]) for c in chunks)

    def _mlp(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        g = F.linear(x, self._p(prefix + "gate_proj.weight"))
        u = F.linear(x, self._p(prefix + "up_proj.weight"))
        return F.linear(F.silu(g) * u, self._p(prefix + "down_proj.weight"))

    def _moe(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        """DeepSeek-V3 noaux_tc routing: sigmoid scores, bias only for choice, group-limited top-k, normalised
        weights times routed_scaling_factor; plus the shared experts."""
        s = self.spec
        gate = self._router_fp32.get(prefix + "gate.weight") if self._router_fp32 else None
        gate = self._p(prefix + "gate.weight").float() if gate is None else gate
        scores = F.linear(x.float(), gate).sigmoid()
        choice = scores + self._p(prefix + "gate.e_score_correction_bias").float()
        if self.fault is EngineFault.PLAIN_TOPK:
            idx = choice.topk(s.num_experts_per_tok, dim=-1)[1]
        else:
            groups = choice.view(-1, s.n_group, s.n_routed_experts // s.n_group).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(groups).scatter_(1, groups.topk(s.topk_group, dim=-1)[1], 1.0)
            keep = keep.unsqueeze(-1).expand(-1, s.n_group, s.n_routed_experts // s.n_group).reshape(len(x), -1)
            idx = choice.masked_fill(keep == 0, float("-inf")).topk(s.num_experts_per_tok, dim=-1)[1]
        if self._capture is not None:
            self._capture[int(prefix.split(".")[2])] = idx
        w = (choice if self.fault is EngineFault.BIASED_WEIGHTS else scores).gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * s.routed_scaling_factor
        out = torch.zeros_like(x)
        for e in idx.unique().tolist():
            tok, slot = (idx == e).nonzero(as_tuple=True)
            y = self._mlp(f"{prefix}experts.{e}.", x[tok]) * w[tok, slot, None].to(x.dtype)
            out.index_add_(0, tok, y)
        if s.n_shared_experts:
            out = out + self._mlp(prefix + "shared_experts.", x)
        return out

    def _qkv(self, i: int, x: torch.Tensor, pos: torch.Tensor):
        """x [T, H] at positions pos [T] -> q_nope [T,N,P], q_pe [T,N,R] (rotated), latent [T, L+R] (cache entry)."""
        s, a = self.spec, f"model.layers.{i}.self_attn."
        if s.q_lora_rank:
            q = F.linear(_rms(F.linear(x, self._p(a + "q_a_proj.weight")), self._p(a + "q_a_layernorm.weight"),
                              s.rms_norm_eps), self._p(a + "q_b_proj.weight"))
        else:
            q = F.linear(x, self._p(a + "q_proj.weight"))
        q = q.view(len(x), s.num_attention_heads, s.qk_head_dim)
        q_nope, q_pe = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        kv = F.linear(x, self._p(a + "kv_a_proj_with_mqa.weight"))
        c, k_pe = kv.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        c = _rms(c, self._p(a + "kv_a_layernorm.weight"), s.rms_norm_eps)
        ang = pos.float()[:, None] * self._inv_freq[None, :]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        q_pe = _rope(q_pe, cos[:, None, :], sin[:, None, :])
        k_pe = _rope(k_pe, cos, sin)
        return q_nope, q_pe, torch.cat([c, k_pe], dim=-1)

    def _attn_prefill(self, i: int, x: torch.Tensor, pos: torch.Tensor):
        """Naive (training-style) path through kv_b_proj, as vLLM's MHA prefill. Returns output and latent."""
        s, a = self.spec, f"model.layers.{i}.self_attn."
        q_nope, q_pe, latent = self._qkv(i, x, pos)
        c, k_pe = latent.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        kv = F.linear(c, self._p(a + "kv_b_proj.weight")).view(len(x), s.num_attention_heads, -1)
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        scores = (torch.einsum("tnp,snp->nts", q_nope, k_nope) + torch.einsum("tnr,sr->nts", q_pe, k_pe)) * self._scale
        causal = torch.ones(len(x), len(x), dtype=torch.bool).tril()
        probs = scores.float().masked_fill(~causal, float("-inf")).softmax(-1).to(x.dtype)
        out = torch.einsum("nts,snv->tnv", probs, v).reshape(len(x), -1)
        return self._o_proj(i, out), latent

    def _attn_decode(self, i: int, x: torch.Tensor, pos: torch.Tensor, cache: torch.Tensor, lengths: torch.Tensor):
        """Absorbed (MQA over the latent) path: one new token per sequence. cache [B, S, L+R] is updated in place."""
        s = self.spec
        q_nope, q_pe, latent = self._qkv(i, x, pos)
        rows = torch.arange(len(x))
        cache[rows, lengths] = latent
        # The absorbed products run in fp32 (cache and weights stay in the engine's dtype): rounding q_lat and o_lat
        # to bf16 at 512 latent dims moved a route of the tiny MoE model at a 0.21 set-score gap from the trainer's
        # naive bf16 forward (measured; this engine's naive prefill path agreed on every route).
        c, k_pe = (t.float() for t in cache.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1))
        w_uk_t, w_uv = (w.to(x.dtype).float() for w in (self._packed or self._absorbed)[i])
        q_lat = torch.einsum("bnp,npl->bnl", q_nope.float(), w_uk_t)
        scores = (torch.einsum("bnl,bsl->bns", q_lat, c) + torch.einsum("bnr,bsr->bns", q_pe.float(), k_pe)) \
            * self._decode_scale
        valid = torch.arange(cache.shape[1])[None, :] <= lengths[:, None]
        probs = scores.masked_fill(~valid[:, None, :], float("-inf")).softmax(-1)
        o_lat = torch.einsum("bns,bsl->bnl", probs, c)
        out = torch.einsum("bnl,nlv->bnv", o_lat, w_uv).reshape(len(x), -1).to(x.dtype)
        return self._o_proj(i, out)

    def _decode_layer(self, i: int, y: torch.Tensor, *, pos, caches, lengths) -> torch.Tensor:
        return self._attn_decode(i, y, pos, caches[i], lengths)

    def _layers(self, h: torch.Tensor, attn) -> torch.Tensor:
        s = self.spec
        for i in range(s.num_hidden_layers):
            p = f"model.layers.{i}."
            h = h + attn(i, _rms(h, self._p(p + "input_layernorm.weight"), s.rms_norm_eps))
            y = _rms(h, self._p(p + "post_attention_layernorm.weight"), s.rms_norm_eps)
            h = h + (self._mlp(p + "mlp.", y) if i < s.first_k_dense_replace else self._moe(p + "mlp.", y))
        h = _rms(h, self._p("model.norm.weight"), s.rms_norm_eps)
        return F.linear(h, self._p("lm_head.weight")).float()

    def _routed(self, rows: int) -> torch.Tensor:
        """The expert ids the forward just run chose: [rows, num_hidden_layers, top_k], dense layers zero (vLLM's
        `routed_experts` layout); resets the capture."""
        s = self.spec
        out = torch.zeros(rows, s.num_hidden_layers, s.num_experts_per_tok, dtype=torch.int32)
        for layer, idx in (self._capture or {}).items():
            out[:, layer] = idx.to(torch.int32)
        self._capture = {}
        return out

    def prefill_logits(self, token_ids: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits [T, vocab] of one sequence through the naive path, and the per-layer latent cache [T, L+R]."""
        x = self._p("model.embed_tokens.weight")[torch.tensor(token_ids)]
        pos = torch.arange(len(token_ids))
        latents: list[torch.Tensor] = []

        def attn(i, y):
            out, lat = self._attn_prefill(i, y, pos)
            latents.append(lat)
            return out

        return self._layers(x, attn), latents

    def sample(self, prompt_token_ids: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
               seed: int | None = None, full_logprobs: bool = False,
               eos_token_id: int | None = None) -> Rollout:
        with torch.no_grad(), torch_threads(self.num_threads):
            return self._sample(prompt_token_ids, max_tokens, temperature, seed, full_logprobs, eos_token_id)

    def _sample(self, prompt_token_ids, max_tokens, temperature, seed, full_logprobs, eos_token_id) -> Rollout:
        self._check_awake("sample")
        if not prompt_token_ids or any(len(p) == 0 for p in prompt_token_ids):
            raise ValueError("sample: every prompt needs at least one token")
        s, b = self.spec, len(prompt_token_ids)
        self._batch_rows = b
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        lengths = torch.tensor([len(p) for p in prompt_token_ids])
        width = s.kv_lora_rank + s.qk_rope_head_dim
        caches = [torch.zeros(b, int(lengths.max()) + max_tokens, width, dtype=self.dtype)
                  for _ in range(s.num_hidden_layers)]
        last, prefilled = [], {}
        # routed experts (return_routed_experts): per row, one [L, top_k] entry per token fed forward
        routes: list[list[torch.Tensor]] = [[] for _ in range(b)]
        self._capture = {} if self.return_routed_experts else None
        for row, prompt in enumerate(prompt_token_ids):
            # GRPO samples n responses per prompt: prefill each distinct prompt once (prefill_logits is a pure
            # function of the tokens, so the rows get the very same values; the tiny lab ran ~3x faster)
            key = tuple(prompt)
            if key not in prefilled:
                prefilled[key] = (*self.prefill_logits(prompt),
                                  self._routed(len(prompt)) if self.return_routed_experts else None)
            logits, latents, prompt_routes = prefilled[key]
            if prompt_routes is not None:
                routes[row].append(prompt_routes)
            for cache, lat in zip(caches, latents, strict=True):
                cache[row, : len(prompt)] = lat
            last.append(logits[-1])
        logits = torch.stack(last)
        tokens: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        dists: list[list[torch.Tensor]] = [[] for _ in range(b)]
        done = torch.zeros(b, dtype=torch.bool)
        for step in range(max_tokens):
            scaled = logits / temperature if temperature > 0 else logits
            logp = scaled.log_softmax(-1)
            nxt = (torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1) if temperature > 0
                   else logits.argmax(-1))
            for row in range(b):
                if not done[row]:
                    tokens[row].append(int(nxt[row]))
                    logps[row].append(float(logp[row, nxt[row]]))
                    if full_logprobs:
                        dists[row].append(logp[row].clone())
            if eos_token_id is not None:
                done |= nxt == eos_token_id
            if step == max_tokens - 1 or bool(done.all()):
                break
            x = self._p("model.embed_tokens.weight")[nxt]
            rows = [slice(r, r + 1) for r in range(b)] if self.batch_invariant else [slice(None)]
            outs = []
            for r in rows:
                outs.append(self._layers(x[r], functools.partial(
                    self._decode_layer, pos=lengths[r].clone(), caches=[c[r] for c in caches], lengths=lengths[r])))
                if self.return_routed_experts:
                    fed = self._routed(outs[-1].shape[0])
                    for k, row in enumerate(range(b)[r]):
                        if not done[row]:  # a finished sequence's last token is not fed forward (no row for it)
                            routes[row].append(fed[k:k + 1])
            logits = torch.cat(outs)
            lengths = lengths + 1
        self._capture = None
        return Rollout(token_ids=tokens, logprobs=logps,
                       dist_logprobs=[torch.stack(d) for d in dists] if full_logprobs else None,
                       routed_experts=[torch.cat(r) for r in routes] if self.return_routed_experts else None)


def make_reference_engine(spec: ModelSpec, *, weights=None, load_format: str = "real",
                          dtype: torch.dtype = torch.float32, seed: int = 0, fault: EngineFault | str | None = None,
                          batch_invariant: bool = False, return_routed_experts: bool = False) -> ReferenceEngine:
    """Factory with the `--engine` signature (see `harness.engines.base.load_factory`); `return_routed_experts`
    fills `Rollout.routed_experts`, as vLLM's `enable_return_routed_experts`."""
    return ReferenceEngine(spec, weights, load_format=load_format, dtype=dtype, seed=seed, fault=fault,
                           batch_invariant=batch_invariant, return_routed_experts=return_routed_experts)
