"""What-if sweeps: the plan with one knob changed at a time, each variant predicted by harness.perf.model, and the
knob that moves TPS/card most. Only variants that pass the plan rules (harness.config.plans.validate_plan) are
predicted; an invalid one is listed with the rule it breaks, never silently dropped."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.config.plans import Recompute, RolloutParallel
from harness.config.scales import Scale
from harness.errors import BadInput, PlanError
from harness.perf.model import Features, predict

KNOBS = ("rollout_tp", "micro_batch", "recompute_layers", "response_length")


@dataclass(frozen=True)
class Variant:
    knob: str
    value: int
    tps_per_card: float | None
    step_s: float | None
    error: str | None = None  # the plan rule the variant breaks


def _variants(scale: Scale, knob: str) -> list[tuple[int, Scale]]:
    plan, batch = scale.plan, scale.batch
    out = []
    if knob == "rollout_tp":
        size = plan.rollout.instance_size
        for tp in (1, 2, 4, 8, 16, 32):
            if size % tp == 0:
                rollout = RolloutParallel(tp=tp, dp=size // tp, ep=plan.rollout.ep)
                out.append((tp, dataclasses.replace(scale, plan=dataclasses.replace(plan, rollout=rollout))))
    elif knob == "micro_batch":
        for mb in (1, 2, 4, 8):
            out.append((mb, dataclasses.replace(scale, batch=dataclasses.replace(
                batch, micro_batch_size_per_device=mb))))
    elif knob == "recompute_layers":
        t = plan.train
        most = max(t.stage_layers) if t.stage_layers else scale.model.num_hidden_layers // t.pp
        for n in sorted({0, 1, most // 4, most // 2, most} - {-1}):
            recompute = Recompute("block", n) if n else None
            train = dataclasses.replace(t, recompute=recompute)
            out.append((n, dataclasses.replace(scale, plan=dataclasses.replace(plan, train=train))))
    elif knob == "response_length":
        for length in sorted({batch.max_response_length // 2, batch.max_response_length,
                              batch.max_response_length * 2}):
            out.append((length, dataclasses.replace(scale, batch=dataclasses.replace(
                batch, max_response_length=length))))
    else:
        raise BadInput(f"what-if knob {knob!r}: use one of {', '.join(KNOBS)}")
    return out


def _valid(scale: Scale) -> bool:
    try:
        scale.validate()
    except PlanError:
        return False
    return True


def sweep(scale: Scale, knob: str, features: Features | None = None, memory=None) -> list[Variant]:
    """The knob's variants of `scale`, each predicted. A plan that itself breaks a rule (a user's recipe can) has
    its variants predicted unvalidated: every one would break the same rule and the sweep would say nothing.
    `memory`: the job's MemoryOptions (its offloads and vLLM pool settings hold for every variant; None: each
    variant's own scale job's)."""
    rows = []
    check = _valid(scale)
    for value, variant in _variants(scale, knob):
        try:
            if check:
                variant.validate()
        except PlanError as exc:
            rows.append(Variant(knob, value, None, None, str(exc)))
            continue
        p = predict(variant, features=features, memory=memory)
        rows.append(Variant(knob, value, p.tps_per_card, p.step_s))
    return rows


def what_if(scale: Scale, features: Features | None = None, memory=None) -> dict:
    """Every knob's sweep and the one whose valid variants span the widest TPS/card range (relative to the
    plan's own prediction), for the job's `memory` options (sweep). JSON-ready."""
    base = predict(scale, features=features, memory=memory).tps_per_card
    knobs, spans = {}, {}
    for knob in KNOBS:
        rows = sweep(scale, knob, features, memory)
        tps = [r.tps_per_card for r in rows if r.tps_per_card is not None]
        spans[knob] = (max(tps) - min(tps)) / base if tps else 0.0
        best = max((r for r in rows if r.tps_per_card is not None), key=lambda r: r.tps_per_card, default=None)
        knobs[knob] = {"span": spans[knob], "best_value": best.value if best else None,
                       "best_tps_per_card": best.tps_per_card if best else None,
                       "variants": [dataclasses.asdict(r) for r in rows]}
    most = max(KNOBS, key=lambda k: spans[k])
    return {"base_tps_per_card": base, "moves_tps_most": most, "variants_validated": _valid(scale), "knobs": knobs}
