"""MLA checkers: an engine's softmax scale against the closed form, its absorbed weights' freshness after a
weight sync (each mismatch diagnosed from evidence: stale / precision loss / layout / unknown), every synced weight's
integrity, aliasing (information), behaviour after the sync (tokens and log-probs), and log-prob alignment with a
reference. Comparisons follow torch.testing.assert_close (`mismatches`).

Two bugs broke 671B DAPO on Ascend (seed 001):
1. vllm-ascend derived the absorbed decode weights W_UK_T / W_UV from `kv_b_proj` with `.contiguous()`
   (copies). verl syncs new weights into `kv_b_proj` in place and never re-runs
   `process_weights_after_loading`, so W_UK_T / W_UV stayed at their (dummy) initial values and rollouts
   were gibberish (fixed by re-deriving after every sync: verl PR #4130, lost in v0.7.0's async path,
   restored by #5235). Upstream vLLM derives them as views, so an in-place sync updates them.
2. MindSpeed's MLA used 1/sqrt(128) (kv_channels) instead of 1/sqrt(192) * mscale^2 as softmax scale.
The closed forms the checks compare with live in harness.mla.derive.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.config.models import ModelSpec
from harness.findings import Finding
from harness.mla.derive import derive_absorbed, misderive_absorbed, softmax_scale, wrong_scales


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

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("mla.softmax_scale", "softmax_scale", f"{self.engine} {self.model}",
                                           self.message()),)


def check_scale(engine_name: str, spec: ModelSpec, actual: float, rtol: float = 1e-6) -> ScaleFinding:
    """Compare an engine's softmax scale with the closed form for `spec`."""
    bug = next((name for name, v in wrong_scales(spec).items() if math.isclose(actual, v, rel_tol=1e-6)), None)
    return ScaleFinding(engine=engine_name, model=spec.name, expected=softmax_scale(spec), actual=float(actual),
                        rtol=rtol, bug=bug)


# ---------------------------------------------------------------- tolerances (data)
@dataclass(frozen=True)
class DtypeTolerance:
    """rtol and atol together, as torch.testing.assert_close takes them."""

    rtol: float
    atol: float


# Per-dtype tolerances for comparing derived weights and outputs (torch.testing.assert_close defaults for
# weights; outputs accumulate over layers, so they get wider bands).
WEIGHT_TOL: dict[torch.dtype, DtypeTolerance] = {
    torch.float32: DtypeTolerance(rtol=1.3e-6, atol=1e-5),
    torch.float16: DtypeTolerance(rtol=1e-3, atol=1e-5),
    torch.bfloat16: DtypeTolerance(rtol=1.6e-2, atol=1e-5),
}
LOGPROB_TOL: dict[torch.dtype, DtypeTolerance] = {
    torch.float32: DtypeTolerance(rtol=1e-4, atol=2e-4),
    torch.float16: DtypeTolerance(rtol=1e-2, atol=2e-2),
    torch.bfloat16: DtypeTolerance(rtol=5e-2, atol=1e-1),
}


def tolerance(table: dict[torch.dtype, DtypeTolerance], dtype: torch.dtype) -> DtypeTolerance:
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {dtype}; known: {', '.join(map(str, table))}") from None


# ---------------------------------------------------------------- freshness
@dataclass(frozen=True)
class Deviation:
    """How far one absorbed weight of one layer is from its derivation from the current kv_b_proj."""

    layer: int
    weight: str  # "W_UK_T" or "W_UV"
    count: int  # elements outside the tolerance
    numel: int
    worst: float  # max |actual - derived| over the mismatches
    where: tuple[int, ...]  # index of the worst mismatch
    cause: str = "unknown"  # one of CAUSES, from the evidence (see `diagnose`)
    owner: str = ""  # where the engine keeps this copy ("impl", "layer"), when it has several

    def describe(self) -> str:
        at = f" ({self.owner})" if self.owner else ""
        return (f"layer {self.layer} {self.weight}{at}: {self.count}/{self.numel} elements off, worst |diff| "
                f"{self.worst:.4g} at {list(self.where)} -> {self.cause}")


# What a freshness mismatch is, by the evidence that matches it, not a fixed blame (bf16 rounding of a re-derived
# copy and a wrong [nope | v] split were once blamed on stale copies); `diagnose` tries them in order.
CAUSES = {
    "stale": "equals the derivation from an EARLIER kv_b_proj (a previous sync or the initial load): a copy not "
             "re-derived after the sync (vllm-ascend .contiguous(); verl PR #4130/#5235) or kv_b_proj rebound to "
             "new storage",
    "precision loss": "within the next-lower dtype's rounding of the right derivation: re-derived, then rounded",
    "layout": "equals a permuted derivation of the current kv_b_proj: wrong [nope | v] split or head order",
    "unknown": "matches neither the previous weights, a rounding, nor a known wrong layout",
}
# The dtype whose rounding explains a "precision loss" mismatch in an engine of the key dtype.
NEXT_LOWER = {torch.float64: torch.float32, torch.float32: torch.bfloat16, torch.float16: torch.float8_e4m3fn,
              torch.bfloat16: torch.float8_e4m3fn}


@dataclass(frozen=True)
class FreshnessReport:
    """Result of `check_freshness`: one Deviation per (layer, weight) that is off; `problems` for layers that
    cannot be checked at all (kv_b_proj dropped, shapes wrong)."""

    engine: str
    tol: DtypeTolerance
    layers_checked: int
    stale: tuple[Deviation, ...]
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.stale and not self.problems

    def message(self) -> str:
        parts = [d.describe() for d in self.stale] + list(self.problems)
        causes = sorted({d.cause for d in self.stale}, key=list(CAUSES).index)
        return (f"{self.engine}: W_UK_T/W_UV are not the derivation of the current kv_b_proj in "
                f"{len(parts)} checks (rtol {self.tol.rtol:g}, atol {self.tol.atol:g}): " + "; ".join(parts) + ". "
                + " ".join(f"{c}: {CAUSES[c]}." for c in causes))

    def findings(self) -> tuple[Finding, ...]:
        return (*(Finding("mla.freshness", d.weight, f"layer {d.layer}", d.describe()) for d in self.stale),
                *(Finding("mla.freshness", "kv_b_proj", "-", p) for p in self.problems))


def mismatches(actual: torch.Tensor, expected: torch.Tensor, tol: DtypeTolerance) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of elements NOT close, |actual - expected|) with torch.testing.assert_close's semantics: finite values
    within atol + rtol * |expected|; a non-finite value is close only to the same value (-inf to -inf; NaN to
    nothing, assert_close's equal_nan=False), so a finite log-prob against a -inf reference is a mismatch, never
    a threshold of inf. Compared in float64 on the CPU (device tensors are moved first: NPUs have no float64)."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    close = torch.isclose(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=False)
    diff = (a - e).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)  # inf - inf is NaN: off by inf
    return ~close, diff


def worst_mismatch(bad: torch.Tensor, diff: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """(worst |diff|, its index), taken over the mismatching elements only, as assert_close reports them (a large
    but tolerated difference elsewhere is not the worst mismatch)."""
    masked = torch.where(bad, diff, torch.full_like(diff, -1.0))
    flat = int(masked.argmax())
    return float(masked.flatten()[flat]), tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))


def _deviation(layer: int, weight: str, actual: torch.Tensor, expected: torch.Tensor,
               tol: DtypeTolerance) -> Deviation | None:
    bad, diff = mismatches(actual, expected, tol)
    if not bool(bad.any()):
        return None
    worst, where = worst_mismatch(bad, diff)
    return Deviation(layer=layer, weight=weight, count=int(bad.sum()), numel=diff.numel(), worst=worst, where=where)


def diagnose(actual: torch.Tensor, expected: torch.Tensor, *, previous: Sequence[torch.Tensor],
             permuted: Sequence[torch.Tensor], tol: DtypeTolerance, dtype: torch.dtype) -> str:
    """The CAUSES key the evidence supports for an absorbed weight that is not `expected`: equal to an earlier
    derivation (stale), within the next-lower dtype's rounding of `expected` (precision loss), equal to a permuted
    derivation (layout), else unknown. Checked in that order: an unchanged weight is stale even when the update
    was small enough to sit within a rounding."""
    if any(not bool(mismatches(actual, p, tol)[0].any()) for p in previous):
        return "stale"
    lower = NEXT_LOWER.get(dtype)
    if lower is not None and not bool(mismatches(actual, expected, DtypeTolerance(
            rtol=torch.finfo(lower).eps, atol=tol.atol))[0].any()):
        return "precision loss"
    if any(not bool(mismatches(actual, p, tol)[0].any()) for p in permuted):
        return "layout"
    return "unknown"


def check_freshness(engine_name: str, layers: Sequence, spec: ModelSpec, dtype: torch.dtype,
                    previous: Sequence[dict[int, torch.Tensor]] = ()) -> FreshnessReport:
    """Every layer's W_UK_T / W_UV must equal the derivation from its CURRENT kv_b_proj within the dtype
    tolerance (layers are `harness.engines.MLALayer`; layers without absorbed weights are skipped). `previous`:
    each earlier state's kv_b_proj by layer (the initial load, earlier syncs), the evidence for a "stale"
    diagnosis (see `diagnose`)."""
    tol = tolerance(WEIGHT_TOL, dtype)
    stale, problems, checked = [], [], 0
    for layer in layers:
        if layer.w_uk_t is None and layer.w_uv is None:
            continue
        checked += 1
        try:
            w_uk_t, w_uv = derive_absorbed(layer.kv_b_proj, spec)
        except ValueError as exc:
            problems.append(f"layer {layer.layer}: {exc} (the engine dropped or reshaped kv_b_proj.weight, so a weight "
                            f"sync cannot reach W_UK_T/W_UV)")
            continue
        earlier = [derive_absorbed(state[layer.layer].to(layer.kv_b_proj.device), spec) for state in previous
                   if layer.layer in state]
        old = ([uk for uk, _ in earlier], [uv for _, uv in earlier])
        wrong = list(zip(*misderive_absorbed(layer.kv_b_proj, spec).values(), strict=True))
        for k, (name, actual, expected) in enumerate((("W_UK_T", layer.w_uk_t, w_uk_t), ("W_UV", layer.w_uv, w_uv))):
            if actual is None:
                continue
            if tuple(actual.shape) != tuple(expected.shape):
                problems.append(f"layer {layer.layer} {name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
                continue
            dev = _deviation(layer.layer, name, actual, expected, tol)
            if dev:
                cause = diagnose(actual, expected, previous=old[k], permuted=wrong[k], tol=tol, dtype=dtype)
                stale.append(dataclasses.replace(dev, cause=cause, owner=getattr(layer, "owner", "")))
    if checked == 0:
        problems.append("the engine exposes no W_UK_T/W_UV in any layer (mla_layers() returned none)")
    return FreshnessReport(engine=engine_name, tol=tol, layers_checked=checked, stale=tuple(stale),
                           problems=tuple(problems))


# -------------------------------------- every weight, not only MLA's (a dropped one read as "prefill diverged")
SHOWN = 6  # weights a failure message names (a broken sync of a whole stage is hundreds; findings list every one)


@dataclass(frozen=True)
class WeightIntegrity:
    """After a sync, each weight the engine computes with (`Engine.synced_weights()`, in checkpoint layout) equals
    the synced one within the dtype tolerance. `unexposed`: synced names the engine does not show (packed or fused
    beyond its reverse mapping), listed, not judged."""

    engine: str
    tol: DtypeTolerance
    checked: int
    off: tuple[tuple[str, int, int, float], ...]  # (name, elements off, numel, worst |diff|)
    unexposed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.off and self.checked > 0  # an engine that opts in but shows none could not fail

    def message(self) -> str:
        if not self.checked:
            return (f"{self.engine}: synced_weights() exposes none of the {len(self.unexposed)} synced weights by "
                    "checkpoint name: nothing to check (return None to opt out)")
        parts = [f"{name}: {count}/{numel} elements off, worst |diff| {worst:.4g}" for name, count, numel, worst
                 in self.off[:SHOWN]]
        more = f"; and {len(self.off) - SHOWN} more (the findings list each)" if len(self.off) > SHOWN else ""
        return (f"{self.engine}: {len(self.off)} of {self.checked} weights the engine computes with are not the "
                f"synced ones (rtol {self.tol.rtol:g}, atol {self.tol.atol:g}): " + "; ".join(parts) + more
                + ". The sync dropped or mis-mapped them.")

    def findings(self) -> tuple[Finding, ...]:
        if not self.checked:
            return (Finding("mla.weight_integrity", "-", "-", self.message()),)
        return tuple(Finding("mla.weight_integrity", name, "-", f"{count}/{numel} elements off")
                     for name, count, numel, _ in self.off)


def check_integrity(engine_name: str, engine_weights: dict[str, torch.Tensor],
                    synced: dict[str, torch.Tensor], dtype: torch.dtype) -> WeightIntegrity:
    """Compare every synced weight with the engine's copy of it (`synced` is cast to the engine dtype first: the
    rounding of the sync itself is not a fault)."""
    tol = tolerance(WEIGHT_TOL, dtype)
    off, checked = [], 0
    for name, want in synced.items():
        have = engine_weights.get(name)
        if have is None:
            continue
        checked += 1
        bad, diff = mismatches(have, want.to(dtype), tol) if have.shape == want.shape else (None, None)
        if bad is None:
            off.append((name, want.numel(), want.numel(), float("inf")))
        elif bool(bad.any()):
            off.append((name, int(bad.sum()), bad.numel(), worst_mismatch(bad, diff)[0]))
    return WeightIntegrity(engine=engine_name, tol=tol, checked=checked, off=tuple(off),
                           unexposed=tuple(sorted(set(synced) - set(engine_weights))))


# ---------------------------------------------------------------- aliasing (information)
@dataclass(frozen=True)
class AliasInfo:
    """Does an absorbed weight share storage with kv_b_proj, and does an in-place write to kv_b_proj show in it
    (the seed's "-100" test)? Information only: re-deriving after every sync is the other valid fix."""

    layer: int
    weight: str
    shares_storage: bool
    propagates: bool


def probe_aliasing(layers: Sequence, spec: ModelSpec) -> list[AliasInfo]:
    """Write -100 into the kv_b_proj element behind W_UK_T[0,0,0] / W_UV[0,0,0] of each layer, read the absorbed
    weight, restore the element. Needs live tensors (an in-process engine)."""
    p = spec.qk_nope_head_dim
    out = []
    with torch.no_grad():
        for layer in layers:
            kv = layer.kv_b_proj
            for name, absorbed, row in (("W_UK_T", layer.w_uk_t, 0), ("W_UV", layer.w_uv, p)):
                if absorbed is None or kv.numel() == 0:
                    continue
                shares = absorbed.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()
                saved = kv[row, 0].clone()
                kv[row, 0] = -100.0
                propagates = bool(absorbed[0, 0, 0] == -100.0)
                kv[row, 0] = saved
                out.append(AliasInfo(layer=layer.layer, weight=name, shares_storage=shares, propagates=propagates))
    return out


# ---------------------------------------------------------------- behaviour after sync
def first_divergence(a: list[list[int]], b: list[list[int]]) -> tuple[int, int] | None:
    """(prompt, token) of the first differing token, or None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # a length mismatch is judged below
        for j in range(max(len(x), len(y))):
            if j >= len(x) or j >= len(y) or x[j] != y[j]:
                return i, j
    return None if len(a) == len(b) else (min(len(a), len(b)), 0)


@dataclass(frozen=True)
class SyncBehaviour:
    """Greedy tokens before the sync, after it, and from an engine built fresh with the new weights; with
    `logprobs` (post-sync per-step log-probs vs the fresh engine's, `compare_logprobs`) also the distributions:
    RL-sized updates (0.01-1 %) leave greedy tokens equal while a stale kernel copy moves log-probs by more than
    the tolerance. `changed` is then judged on the fresh log-probs vs the pre-sync ones."""

    engine: str
    pre: list[list[int]]
    post: list[list[int]]
    fresh: list[list[int]]
    logprobs: LogprobAlignment | None = None
    update: LogprobAlignment | None = None  # pre-sync vs fresh log-probs: the update must be visible

    @classmethod
    def of_rollouts(cls, engine: str, pre, post, fresh, dtype: torch.dtype, what: str = "sync") -> SyncBehaviour:
        """From three rollouts (token_ids and dist_logprobs each: before the sync, after it, a fresh engine's), with
        both log-prob comparisons; `what` names the sync in their messages."""
        return cls(engine=engine, pre=pre.token_ids, post=post.token_ids, fresh=fresh.token_ids,
                   logprobs=compare_logprobs(f"{engine} after the {what} vs fresh", post.dist_logprobs,
                                             fresh.dist_logprobs, dtype),
                   update=compare_logprobs(f"{engine} before the {what} vs fresh", pre.dist_logprobs,
                                           fresh.dist_logprobs, dtype))

    @property
    def matches_fresh(self) -> bool:
        return first_divergence(self.post, self.fresh) is None and (self.logprobs is None or self.logprobs.ok)

    @property
    def changed(self) -> bool:
        if self.update is not None:
            return not self.update.ok
        return first_divergence(self.post, self.pre) is not None

    @property
    def ok(self) -> bool:
        return self.matches_fresh and self.changed

    def message(self) -> str:
        if not self.changed:
            return (f"{self.engine}: the outputs before the weight sync equal those of an engine built fresh with "
                    f"the new weights: the sync changed nothing this check could see (sensitivity guard)")
        if first_divergence(self.post, self.fresh) is None:
            return (f"{self.engine}: after the weight sync greedy tokens match an engine built fresh with the new "
                    f"weights, but the log-probs do not: {self.logprobs.message()} (step 0 is prefill, later steps "
                    f"decode through W_UK_T/W_UV)")
        i, j = first_divergence(self.post, self.fresh)
        n_bad = sum(first_divergence([x], [y]) is not None for x, y in zip(self.post, self.fresh, strict=False))
        where = "prefill (first token)" if j == 0 else "decode (absorbed W_UK_T/W_UV path)"
        got = self.post[i][j] if j < len(self.post[i]) else None
        want = self.fresh[i][j] if j < len(self.fresh[i]) else None
        return (f"{self.engine}: after the weight sync {n_bad}/{len(self.fresh)} prompts decode differently from an "
                f"engine built fresh with the new weights; first at prompt {i} token {j} in {where}: got {got}, "
                f"fresh {want}")

    def findings(self) -> tuple[Finding, ...]:
        if self.ok:
            return ()
        first = first_divergence(self.post, self.fresh) if self.changed else None
        if first is None and self.changed:
            return (Finding("mla.sync_behaviour", "log-probs", f"prompt {self.logprobs.where[0]} step "
                            f"{self.logprobs.where[1]}", self.message()),)
        where = f"prompt {first[0]} token {first[1]}" if first else "-"
        return (Finding("mla.sync_behaviour", "greedy tokens", where, self.message()),)


@dataclass(frozen=True)
class AtSync:
    """A check result taken after one sync of a series (old -> new -> old -> ...): its message says which."""

    label: str  # e.g. "sync 3/6 (old)"
    result: object  # a CheckResult

    @property
    def ok(self) -> bool:
        return self.result.ok

    def message(self) -> str:
        return f"after {self.label}: {self.result.message()}"

    def findings(self) -> tuple[Finding, ...]:
        return tuple(dataclasses.replace(f, where=f"{self.label}: {f.where}") for f in self.result.findings())


# ---------------------------------------------------------------- forward alignment
@dataclass(frozen=True)
class LogprobAlignment:
    """Per-step log-probabilities of one engine vs a reference, per the LOGPROB_TOL table."""

    name: str
    tol: DtypeTolerance
    count: int  # elements outside tolerance
    numel: int
    worst: float
    where: tuple[int, int, int]  # (prompt, step, token id) of the worst element

    @property
    def ok(self) -> bool:
        return self.count == 0

    def message(self) -> str:
        return (f"{self.name}: {self.count}/{self.numel} log-probs outside rtol {self.tol.rtol:g} atol "
                f"{self.tol.atol:g}; worst |diff| {self.worst:.4g} at prompt {self.where[0]} step {self.where[1]} "
                f"token {self.where[2]}")

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("mla.logprobs", "log-probs", f"prompt {self.where[0]} step {self.where[1]}",
                                           self.message()),)


def compare_logprobs(name: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                     dtype: torch.dtype, first_step: int = 0) -> LogprobAlignment:
    """Compare per-prompt [T, vocab] log-prob tables (e.g. rollout decode steps vs the training forward).
    `first_step`: the step number of row 0, when the tables are a slice (decode steps start at 1)."""
    tol = tolerance(LOGPROB_TOL, dtype)
    count = numel = 0
    worst, where = -1.0, (0, 0, 0)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            raise ValueError(f"{name}: prompt {i} shapes differ: {tuple(g.shape)} vs {tuple(w.shape)}")
        bad, diff = mismatches(g, w, tol)
        count += int(bad.sum())
        numel += diff.numel()
        if bool(bad.any()):
            d, (step, tok) = worst_mismatch(bad, diff)
            if d > worst:
                worst, where = d, (i, first_step + step, tok)
    return LogprobAlignment(name=name, tol=tol, count=count, numel=numel, worst=max(worst, 0.0), where=where)


# bf16 rounding of the hidden state can move a token to a near-tied expert, and that step's whole distribution
# then differs (measured on the tiny MoE model, 24 steps: the reference engine in bf16 vs transformers, 1 step off
# by up to 0.74; in fp32 none). A step count, not a looser tolerance: a routing bug moves many steps (plain top-k
# instead of grouped: 23 of 24 in bf16; gating weights from the bias-corrected scores: 7 of 24; all 24 in fp32).
ROUTE_FLIP_STEPS: dict[torch.dtype, float] = {torch.float32: 0.0, torch.float16: 1 / 8, torch.bfloat16: 1 / 8}


@dataclass(frozen=True)
class MoELogprobAlignment:
    """`compare_logprobs` on an MoE model, with up to `allowed` whole steps outside tolerance (the ROUTE_FLIP_STEPS
    share of the steps for the dtype: near-tie route flips); `off_steps` is how many steps had any entry outside."""

    alignment: LogprobAlignment
    off_steps: int
    steps: int
    allowed: int

    @property
    def ok(self) -> bool:
        return self.off_steps <= self.allowed

    def message(self) -> str:
        return (f"{self.alignment.message()}; {self.off_steps}/{self.steps} steps outside, {self.allowed} allowed "
                "(near-tie route flips)")

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else self.alignment.findings()


def compare_moe_logprobs(name: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                         dtype: torch.dtype, first_step: int = 0) -> MoELogprobAlignment:
    """`compare_logprobs`, judged by the number of steps outside tolerance (see ROUTE_FLIP_STEPS)."""
    alignment = compare_logprobs(name, got, want, dtype, first_step)
    tol = tolerance(LOGPROB_TOL, dtype)
    off = sum(int(mismatches(g, w, tol)[0].any(-1).sum()) for g, w in zip(got, want, strict=True))
    steps = sum(len(g) for g in got)
    return MoELogprobAlignment(alignment=alignment, off_steps=off, steps=steps,
                               allowed=int(ROUTE_FLIP_STEPS.get(dtype, 0.0) * steps))
