"""Plan validation: every registered scale is valid; hypothesis draws valid plans by construction
(world size from divisors) and breaks one rule at a time, which must be rejected naming that rule."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.models import DEEPSEEK_V3, MODELS, MOONLIGHT_16B, TINY, ModelSpec
from harness.config.plans import (
    RECOMPUTE_METHODS,
    ParallelPlan,
    PlanError,
    Recompute,
    RolloutParallel,
    TrainParallel,
    validate_plan,
)
from harness.config.scales import SCALES

# The `ci` profile (derandomize, no deadline) is registered by the plugin in pytest_configure.
CI = settings(settings.get_profile("ci"), max_examples=60)


@pytest.mark.parametrize("name", sorted(SCALES))
def test_every_scale_plan_is_valid(name):
    SCALES[name].validate()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclasses.dataclass(frozen=True)
class Case:
    model: ModelSpec
    plan: ParallelPlan
    world: int


@st.composite
def stage_layers(draw, num_layers: int, pp: int) -> tuple[int, ...]:
    """A split of num_layers into pp non-empty stages that megatron-core 0.12 can express (uneven first/last
    stages, an even middle), or () for Megatron's uniform split."""
    if pp == 1 or (num_layers % pp == 0 and draw(st.booleans())):
        return ()
    if pp == 2:
        first = draw(st.integers(1, num_layers - 1))
        return (first, num_layers - first)
    # valid by construction: draw the middle stage size, then split what is left between first and last
    middle = draw(st.integers(1, (num_layers - 2) // (pp - 2)))
    rest = num_layers - middle * (pp - 2)
    first = draw(st.integers(1, rest - 1))
    return (first, *[middle] * (pp - 2), rest - first)


@st.composite
def recomputes(draw, layers: tuple[int, ...], num_layers: int, pp: int) -> Recompute | None:
    most = max(layers) if layers else num_layers // pp
    if not draw(st.booleans()):
        return None
    return Recompute(method=draw(st.sampled_from(RECOMPUTE_METHODS)), num_layers=draw(st.integers(1, most)))


@st.composite
def valid_cases(draw) -> Case:
    model = draw(st.sampled_from([TINY, MOONLIGHT_16B, DEEPSEEK_V3, MODELS["deepseek-v3-4l"]]))
    tp = draw(st.sampled_from(_divisors(model.num_attention_heads)[:6]))
    pp = draw(st.integers(1, min(model.num_hidden_layers, 16)))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from(_divisors(model.n_routed_experts)))
    etp = draw(st.sampled_from([d for d in _divisors(model.moe_intermediate_size) if d <= 8]))
    # Megatron: ep*etp tiles the tp*cp*dp ranks of a stage, so dp is a multiple of what tp*cp lacks.
    dp = ep * etp // math.gcd(tp * cp, ep * etp) * draw(st.integers(1, 3))
    world = tp * pp * cp * dp
    layers = draw(stage_layers(model.num_hidden_layers, pp))
    if not layers and model.num_hidden_layers % pp:
        layers = (model.num_hidden_layers - (pp - 1), *([1] * (pp - 1)))
    recompute = draw(recomputes(layers, model.num_hidden_layers, pp))
    rtp = draw(st.sampled_from([d for d in _divisors(model.num_attention_heads) if world % d == 0]))
    rdp = draw(st.sampled_from(_divisors(world // rtp)))
    rep = rtp * rdp if model.n_routed_experts % (rtp * rdp) == 0 and draw(st.booleans()) else 1
    plan = ParallelPlan(TrainParallel(tp, pp, ep, etp, cp, layers, recompute), RolloutParallel(rtp, rdp, rep))
    return Case(model, plan, world)


@CI
@given(valid_cases())
def test_valid_by_construction(case):
    validate_plan(case.plan, case.model, case.world)


def _train(case: Case, **changes) -> Case:
    train = dataclasses.replace(case.plan.train, **changes)
    return dataclasses.replace(case, plan=dataclasses.replace(case.plan, train=train))


def _rollout(case: Case, **changes) -> Case:
    rollout = dataclasses.replace(case.plan.rollout, **changes)
    return dataclasses.replace(case, plan=dataclasses.replace(case.plan, rollout=rollout))


def _non_divisor(n: int) -> int:
    return next(d for d in range(2, n + 2) if n % d)


def _bad_tp(case: Case) -> Case:
    t = case.plan.train
    tp = _non_divisor(case.model.num_attention_heads)
    # keep the world divisible so the first violated rule is the heads rule
    return dataclasses.replace(_train(case, tp=tp), world=case.world // t.tp * tp)


def _bad_world(case: Case) -> Case | None:
    t = case.plan.train
    return None if t.tp * t.pp * t.cp == 1 else dataclasses.replace(case, world=case.world + 1)


def _bad_stage_sum(case: Case) -> Case | None:
    layers = case.plan.train.stage_layers
    return _train(case, stage_layers=(layers[0] + 1, *layers[1:])) if layers else None


def _bad_stage_count(case: Case) -> Case | None:
    layers = case.plan.train.stage_layers
    return _train(case, stage_layers=(*layers, 1)) if layers else None


def _bad_stage_middle(case: Case) -> Case | None:
    """Seed 002's 7,7,8,8,8,8,8,7 kind of split: an uneven middle megatron-core 0.12 cannot express."""
    layers = case.plan.train.stage_layers
    if len(layers) < 4 or layers[1] < 2:
        return None
    return _train(case, stage_layers=(layers[0], layers[1] - 1, layers[2] + 1, *layers[3:]))


def _bad_recompute_method(case: Case) -> Case:
    return _train(case, recompute=Recompute(method="selective", num_layers=1))


def _bad_recompute_layers(case: Case) -> Case:
    return _train(case, recompute=Recompute(method="block", num_layers=case.model.num_hidden_layers + 1))


def _bad_ep(case: Case) -> Case:
    return _train(case, ep=_non_divisor(case.model.n_routed_experts))


def _bad_rollout_ep(case: Case) -> Case | None:
    r = case.plan.rollout
    return _rollout(case, ep=2 * r.instance_size) if r.instance_size * 2 > 1 else None


def _bad_positive(case: Case) -> Case:
    return _rollout(case, tp=0)


BREAKERS = {
    "tp-divides-heads": _bad_tp,
    "world-divisible": _bad_world,
    "stage-layers-sum": _bad_stage_sum,
    "stage-count": _bad_stage_count,
    "stage-layers-expressible": _bad_stage_middle,
    "recompute-method": _bad_recompute_method,
    "recompute-num-layers": _bad_recompute_layers,
    "ep-divides-experts": _bad_ep,
    "rollout-ep-is-instance": _bad_rollout_ep,
    "positive": _bad_positive,
}


@pytest.mark.parametrize("rule", sorted(BREAKERS))
@CI
@given(case=valid_cases())
def test_invalid_plan_names_the_rule(rule, case):
    broken = BREAKERS[rule](case)
    if broken is None:  # this valid case has nothing to break for that rule (e.g. uniform stages)
        return
    with pytest.raises(PlanError) as err:
        validate_plan(broken.plan, broken.model, broken.world)
    message = str(err.value)
    assert message.startswith(f"rule {rule}:"), f"expected rule {rule}, got: {message}"
    assert "\n" not in message


def test_a3_stage_layers():
    # seed 002's A3 split 7,7,8,8,8,8,8,7 (MindSpeed's --num-layer-list) has an uneven middle that megatron-core
    # 0.12 cannot build; the plan runs the closest expressible split, verl's r1_ascend 6,8,...,8,7.
    plan = SCALES["full-a3"].plan
    assert plan.train.stage_layers == (6, 8, 8, 8, 8, 8, 8, 7)
    validate_plan(plan, DEEPSEEK_V3, 256)
    case = Case(DEEPSEEK_V3, plan, 256)
    with pytest.raises(PlanError, match=r"^rule stage-layers-expressible: .*\[7, 7, 8, 8, 8, 8, 8, 7\]"):
        bad = _train(case, stage_layers=(7, 7, 8, 8, 8, 8, 8, 7))
        validate_plan(bad.plan, DEEPSEEK_V3, 256)
    with pytest.raises(PlanError, match=r"^rule stage-layers-sum: .*sum to 62, model deepseek-v3 has 61"):
        bad = _train(case, stage_layers=(7, 8, 8, 8, 8, 8, 8, 7))
        validate_plan(bad.plan, DEEPSEEK_V3, 256)


def test_uniform_middle_helper():
    assert TrainParallel.uniform_middle(61, 16, 3, 2) == (3, *[4] * 14, 2)
    with pytest.raises(PlanError, match="rule pp-uniform-middle"):
        TrainParallel.uniform_middle(61, 8, 7, 7)
