"""MoE routing consistency between the rollout engine and the trainer: which experts each token went to.

Small numeric differences between the rollout engine and the trainer flip near-tied top-k choices; the sampled
tokens then come from another sub-network than the one trained, and MoE RL collapses (Rollout Routing Replay, R3,
arXiv 2510.11370; verl PRs #4101 / #5185). Routes are compared in vLLM's layout, `[prompt + output - 1,
num_hidden_layers, top_k]` per sequence (vllm fused_moe/routed_experts_capturer.py; absolute layer index, dense
layers zero, no row for the last generated token); both sides call topk unsorted, so top-k SETS are compared.

- `check_routes`: every MoE row has top_k distinct ids in range, every dense row is empty, the row count is the
  layout's (the all-zero-routes and off-by-one bug classes).
- `check_agreement`: per MoE layer the share of tokens whose sets agree; a disagreement must be a near tie, i.e.
  the rollout's set scores within the dtype's tie tolerance of the trainer's own set under the TRAINER's choice
  scores (sigmoid + e_score_correction_bias), or lie downstream of one: a flip at (token t', layer l') changes
  the hidden states every later layer sees at tokens >= t', so (t, l) with t >= t', l > l' may then differ at any
  margin. A first flip at a wide margin is a bug (another bias or gate, routes of another layer or token).
- `replay_targets`: the rollout routes laid out for the training batch, as verl 0.9.1's R3 does it
  (utils/megatron/router_replay_utils.py: `align_r3_router_replay_data` appends one placeholder row for the final
  token, `build_r3_replay_mask` leaves that row native, `set_router_replay_data` indexes by absolute layer when
  the routes cover every layer, and pack/unpack follow the attention mask); `ReplayFault` seeds the ways to get
  it wrong.
- `check_replay`: with the rollout routes replayed, agreement is 100 % on every MoE layer and the rollout/training
  log-prob gap is no larger than without replay (and within the dtype's log-prob tolerance).
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.config.models import ModelSpec
from harness.findings import Finding
from harness.mla.checks import LOGPROB_TOL, DtypeTolerance, tolerance

# A disagreement is a near tie when the two expert sets' summed choice scores (top_k sigmoids in (0, 1) plus the
# bias) differ by at most this under the trainer's scores. Measured on vLLM CPU vs transformers (tiny MoE, near-tied
# experts): first flips at gaps <= 4.8e-7 in fp32, <= 2.5e-2 in bf16 (bf16 rounds the gate's inputs at 2^-8); a
# route from another layer or bias differs by O(0.1-1).
TIE_TOL: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def moe_layers(spec: ModelSpec) -> range:
    return range(spec.first_k_dense_replace, spec.num_hidden_layers)


# ---------------------------------------------------------------- route validity
@dataclass(frozen=True)
class RouteValidity:
    """Per sequence: problems of its routes (wrong row count, an MoE row without top_k distinct in-range ids,
    a dense row that is not empty)."""

    source: str
    sequences: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.sequences > 0 and not self.problems

    def message(self) -> str:
        if not self.sequences:
            return f"{self.source}: no routes returned"
        head = f"{self.source}: {len(self.problems)} route problem(s) in {self.sequences} sequences"
        return head + (": " + "; ".join(self.problems[:8]) if self.problems else "")

    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding("routing.validity", "routed_experts", p.split(":")[0], p) for p in self.problems[:8]) \
            or (() if self.ok else (Finding("routing.validity", "routed_experts", "-", self.message()),))


def check_routes(source: str, routes: Sequence[torch.Tensor] | None, spec: ModelSpec,
                 rows: Sequence[int]) -> RouteValidity:
    """`routes[i]` [rows[i], num_hidden_layers, top_k]: MoE rows hold top_k distinct ids in [0, n_routed_experts),
    dense rows are all zero."""
    problems: list[str] = []
    for i, (r, n) in enumerate(zip(routes or (), rows, strict=False)):
        want = (n, spec.num_hidden_layers, spec.num_experts_per_tok)
        if tuple(r.shape) != want:
            problems.append(f"sequence {i}: routes shape {tuple(r.shape)}, expected {want} "
                            "(prompt + output - 1 rows, every layer, top_k)")
            continue
        for layer in range(spec.num_hidden_layers):
            ids = r[:, layer]
            if layer < spec.first_k_dense_replace:
                bad = (ids != 0).any(-1)
                what = "dense layer with routes (expected empty rows)"
            else:
                distinct = ids.sort(-1).values.diff(dim=-1).ne(0).all(-1)
                bad = ~distinct | (ids < 0).any(-1) | (ids >= spec.n_routed_experts).any(-1)
                what = f"MoE row without {spec.num_experts_per_tok} distinct ids in [0, {spec.n_routed_experts})"
            if bool(bad.any()):
                t = int(bad.nonzero()[0])
                problems.append(f"sequence {i} layer {layer}: {int(bad.sum())}/{len(bad)} rows: {what}, first token "
                                f"{t}: {ids[t].tolist()}")
    if routes is not None and len(routes) != len(rows):
        problems.append(f"{len(routes)} route tensors for {len(rows)} sequences")
    return RouteValidity(source=source, sequences=len(routes or ()), problems=tuple(problems))


# ---------------------------------------------------------------- agreement
@dataclass(frozen=True)
class LayerAgreement:
    """One MoE layer: tokens compared, tokens whose top-k sets agree, and the disagreements."""

    layer: int
    tokens: int
    agreed: int
    disagreements: tuple[Disagreement, ...]

    @property
    def share(self) -> float:
        return self.agreed / self.tokens if self.tokens else 0.0

    def wide(self, tol: float) -> tuple[Disagreement, ...]:
        """The disagreements neither a near tie nor downstream of an earlier flip."""
        return tuple(d for d in self.disagreements if d.gap > tol and not d.downstream)

    def to_json(self) -> dict:
        first = [d.gap for d in self.disagreements if not d.downstream]
        return {"layer": self.layer, "tokens": self.tokens, "agreed": self.agreed, "share": self.share,
                "first_flips": len(first), "downstream": len(self.disagreements) - len(first),
                "max_first_gap": max(first, default=0.0)}


@dataclass(frozen=True)
class Disagreement:
    """A token whose top-k sets differ: where, the set-score gap under the trainer's choice scores, and whether an
    earlier flip (an earlier MoE layer at this or an earlier token) already changed its inputs."""

    sequence: int
    token: int
    gap: float
    downstream: bool


@dataclass(frozen=True)
class RoutingAgreement:
    """Per MoE layer agreement of the rollout's routes with the trainer's; `tie_tol`: the widest set-score gap a
    numeric flip may have. `exact`: every token must agree (the routes were replayed)."""

    name: str
    layers: tuple[LayerAgreement, ...]
    tie_tol: float
    exact: bool = False

    @property
    def ok(self) -> bool:
        if not self.layers or any(la.tokens == 0 for la in self.layers):
            return False
        if self.exact:
            return all(la.agreed == la.tokens for la in self.layers)
        return not any(la.wide(self.tie_tol) for la in self.layers)

    def summary(self) -> str:
        return ", ".join(f"layer {la.layer} {la.share:.1%} ({la.agreed}/{la.tokens})" for la in self.layers)

    def message(self) -> str:
        head = f"{self.name}: top-k sets agree on {self.summary()}"
        if self.ok:
            return head
        if not self.layers or any(la.tokens == 0 for la in self.layers):
            return f"{head}: nothing to compare (no routes, or no MoE layer)"
        if self.exact:
            parts = [f"layer {la.layer} first at sequence {la.disagreements[0].sequence} token "
                     f"{la.disagreements[0].token}" for la in self.layers if la.disagreements]
            return f"{head}; replayed routes must agree on every token: " + "; ".join(parts)
        parts = []
        for la in self.layers:
            wide = la.wide(self.tie_tol)
            if wide:
                worst = max(wide, key=lambda d: d.gap)
                parts.append(f"layer {la.layer}: {len(wide)} first flips at a wide margin, worst gap {worst.gap:.4g} "
                             f"at sequence {worst.sequence} token {worst.token}")
        return (f"{head}; a first flip must be a near tie (set-score gap <= {self.tie_tol:g} under the trainer's "
                "choice scores), these are not: " + "; ".join(parts) + " (another router bias or gate, or routes "
                "written to the wrong layer or token)")

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("routing.agreement", "routed_experts",
                                           ", ".join(f"layer {la.layer}" for la in self.layers
                                                     if la.disagreements) or "-", self.message()),)

    def to_json(self) -> dict:
        return {"name": self.name, "tie_tol": self.tie_tol, "exact": self.exact,
                "layers": [la.to_json() for la in self.layers]}


def _set_score(choice: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return choice.gather(-1, ids.long()).sum(-1)


def check_agreement(name: str, rollout: Sequence[torch.Tensor], training: Sequence[torch.Tensor],
                    choice: Sequence[torch.Tensor], spec: ModelSpec, dtype: torch.dtype, *,
                    exact: bool = False) -> RoutingAgreement:
    """rollout[i] [n_i, L, k] vs training[i] [>= n_i, L, k] (its first n_i rows: the trainer also routes the last
    token, which the rollout never fed forward), with the trainer's choice scores choice[i] [>= n_i, L, E]."""
    layers = []
    first_flip: dict[int, list[tuple[int, int]]] = {}  # sequence -> (layer, token) of the disagreements so far
    for layer in moe_layers(spec):
        tokens = agreed = 0
        dis: list[Disagreement] = []
        for i, (r, t, c) in enumerate(zip(rollout, training, choice, strict=True)):
            n = len(r)
            a, b = r[:, layer].long(), t[:n, layer].long()
            same = (a.sort(-1).values == b.sort(-1).values).all(-1)
            gap = (_set_score(c[:n, layer], b) - _set_score(c[:n, layer], a)).abs()
            tokens += n
            agreed += int(same.sum())
            earlier = first_flip.setdefault(i, [])
            for j in (~same).nonzero().flatten().tolist():
                downstream = any(lay < layer and tok <= j for lay, tok in earlier)
                dis.append(Disagreement(sequence=i, token=j, gap=float(gap[j]), downstream=downstream))
            earlier += [(layer, j) for j in (~same).nonzero().flatten().tolist()]
        layers.append(LayerAgreement(layer=layer, tokens=tokens, agreed=agreed, disagreements=tuple(dis)))
    return RoutingAgreement(name=name, layers=tuple(layers), tie_tol=TIE_TOL[dtype], exact=exact)


# ---------------------------------------------------------------- replay
class ReplayFault(str, enum.Enum):
    """Ways to lay rollout routes out for the training forward wrong (seeded replay bugs).

    SHIFTED          the placeholder for the final token put first: every route lands one token late.
    REVERSED_LAYERS  the MoE layers' routes in reverse order (routers walked the other way round).
    MOE_ORDINAL      routes covering every layer indexed by MoE ordinal instead of absolute layer: with DSV3's 3
                     dense layers, layer 3 takes layer 0's (empty) routes (the R2 branch of verl's
                     `set_router_replay_data` on an R3 tensor).
    IGNORE_LEFT_PADDING  routes placed from position 0 of the padded row instead of the first real token: every
                     shorter prompt's routes land on padding and earlier tokens.
    """

    SHIFTED = "shifted"
    REVERSED_LAYERS = "reversed_layers"
    MOE_ORDINAL = "moe_ordinal"
    IGNORE_LEFT_PADDING = "ignore_left_padding"


def replay_targets(routes: Sequence[torch.Tensor], prompt_lens: Sequence[int], response_lens: Sequence[int],
                   spec: ModelSpec, fault: ReplayFault | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets [B, S, L, k], mask [B, S]) for a batch padded as the actor's (prompts left-padded to the longest,
    responses right-padded): each sequence's P+R-1 rollout rows plus one placeholder for its final token, at the
    positions of its real tokens; the mask replays every real token but the final one (verl 0.9.1
    `align_r3_router_replay_data`, `build_r3_replay_mask`, module docstring)."""
    fault = ReplayFault(fault) if fault is not None else None
    width_p, width_r = max(prompt_lens), max(response_lens)
    k = spec.num_experts_per_tok
    targets = torch.zeros(len(routes), width_p + width_r, spec.num_hidden_layers, k, dtype=torch.long)
    mask = torch.zeros(len(routes), width_p + width_r, dtype=torch.bool)
    moe = list(moe_layers(spec))
    for b, (r, p, n) in enumerate(zip(routes, prompt_lens, response_lens, strict=True)):
        r = r.long()
        if len(r) != p + n - 1:
            raise ValueError(f"sequence {b}: {len(r)} route rows for {p} prompt + {n} response tokens; expected "
                             f"{p + n - 1} (no row for the final token)")
        placeholder = torch.zeros(1, *r.shape[1:], dtype=r.dtype)
        rows = torch.cat([placeholder, r] if fault is ReplayFault.SHIFTED else [r, placeholder])
        if fault is ReplayFault.REVERSED_LAYERS:
            rows[:, moe] = rows[:, moe[::-1]]
        elif fault is ReplayFault.MOE_ORDINAL:
            rows[:, moe] = rows[:, [layer - spec.first_k_dense_replace for layer in moe]]
        start = 0 if fault is ReplayFault.IGNORE_LEFT_PADDING else width_p - p
        targets[b, start:start + p + n] = rows
        mask[b, start:start + p + n - 1] = True
    return targets, mask


@dataclass(frozen=True)
class ReplayCheck:
    """Router replay end to end: agreement of the routes the training forward used with the rollout's (must be
    100 %), and the worst rollout/training log-prob gap with and without replay."""

    name: str
    agreement: RoutingAgreement
    gap_with: float
    gap_without: float
    tol: DtypeTolerance
    within_tol: bool

    @property
    def ok(self) -> bool:
        return self.agreement.ok and self.gap_with <= self.gap_without + self.tol.atol and self.within_tol

    def message(self) -> str:
        parts = [f"{self.name}: log-prob gap with replay {self.gap_with:.3g}, without {self.gap_without:.3g}"]
        if not self.agreement.ok:
            parts.append(self.agreement.message())
        if self.gap_with > self.gap_without + self.tol.atol:
            parts.append("replay made the rollout/training gap LARGER: the replayed routes are not the rollout's")
        if not self.within_tol:
            parts.append(f"with replay the log-probs still differ beyond rtol {self.tol.rtol:g} atol "
                         f"{self.tol.atol:g}")
        return "; ".join(parts)

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("routing.replay", "log-probs", "-", self.message()),)

    def to_json(self) -> dict:
        return {"name": self.name, "gap_with": self.gap_with, "gap_without": self.gap_without,
                "agreement": self.agreement.to_json()}


@dataclass(frozen=True)
class RouterGradients:
    """R3 must keep training the router: under replay the routing probs are still the router's scores gathered at
    the replayed experts, so the router weight's gradient equals, to float noise, the native forward's with the
    same routes (harness.engines.router_replay_probe `gradients`). A replay whose scores leave the graph
    (ISEEKYAN/Megatron-LM#79: scores taken after top-k zeroes them) reads 0, and RL updates every weight but the
    router: nothing in the forward routes or log-probs shows it."""

    router: str
    native: float  # the native gradient's norm
    replay: float  # the replayed one's norm
    max_abs_diff: float  # their largest element-wise difference
    rtol: float = 1e-5  # of the native norm

    @classmethod
    def of(cls, router: str, probe: dict, replay: str = "replay") -> RouterGradients:
        """From the probe's `gradients_*` answer; `replay`: which replay ("replay", "replay_detached")."""
        return cls(router=router, native=float(probe["native"]), replay=float(probe[replay]),
                   max_abs_diff=float(probe[f"{replay}_max_abs_diff"]))

    @property
    def ok(self) -> bool:
        return self.native > 0 and self.max_abs_diff <= self.rtol * self.native

    def message(self) -> str:
        if self.native <= 0:
            return f"{self.router}: the native forward gives the router no gradient: the check could not fail"
        if self.ok:
            return (f"{self.router}: the router's gradient under replay equals the native one (norm "
                    f"{self.replay:.6g}, max |diff| {self.max_abs_diff:.3g})")
        dead = " -- the replay cut the router out of the graph (ISEEKYAN/Megatron-LM#79)" if self.replay == 0 else ""
        return (f"{self.router}: router weight gradient under R3 replay differs from the native forward's with the "
                f"same routes by up to {self.max_abs_diff:.4g} (norms {self.replay:.6g} vs {self.native:.6g}; rtol "
                f"{self.rtol:g} of the norm){dead}")

    def findings(self) -> tuple[Finding, ...]:
        return () if self.ok else (Finding("routing.router_gradients", "router.weight grad norm", self.router,
                                           self.message()),)


def logprob_gap(rollout: Sequence[Sequence[float]], training: Sequence[torch.Tensor]) -> float:
    return max(float((torch.tensor(list(r), dtype=torch.float64) - t.double()).abs().max())
               for r, t in zip(rollout, training, strict=True))


def check_replay(name: str, rollout_routes: Sequence[torch.Tensor], rollout_logprobs: Sequence[Sequence[float]],
                 replayed, native, spec: ModelSpec, dtype: torch.dtype) -> ReplayCheck:
    """`replayed` / `native`: the trainer's forward (harness.engines.training.RoutedForward) with and without the
    rollout routes replayed."""
    tol = tolerance(LOGPROB_TOL, dtype)
    agreement = check_agreement(f"{name} (replayed)", rollout_routes, replayed.routes, replayed.choice, spec, dtype,
                                exact=True)
    within = all(bool(torch.isclose(t.double(), torch.tensor(list(r), dtype=torch.float64), rtol=tol.rtol,
                                    atol=tol.atol).all())
                 for r, t in zip(rollout_logprobs, replayed.logprobs, strict=True))
    return ReplayCheck(name=name, agreement=agreement, gap_with=logprob_gap(rollout_logprobs, replayed.logprobs),
                       gap_without=logprob_gap(rollout_logprobs, native.logprobs), tol=tol, within_tol=within)
