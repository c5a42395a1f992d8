"""Parallel plans for training (Megatron + MindSpeed) and rollout (vLLM / vllm-ascend), with validation.

`validate_plan` checks a plan against a model and a world size; each violated rule is a `PlanError`
whose one-line message names the rule and the numbers, so a wrong plan fails before a 256-card job
is booked, not 40 minutes into it.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config.models import ModelSpec
from harness.errors import PlanError

RECOMPUTE_METHODS = ("uniform", "block")


@dataclass(frozen=True)
class Recompute:
    """Megatron full activation recompute: TransformerConfig `recompute_granularity="full"`, `recompute_method`,
    `recompute_num_layers` (megatron-core core_r0.12.1 transformer/transformer_block.py
    `TransformerBlock._checkpointed_forward`):

    - `uniform`: the stage's layers in chunks of `num_layers`; each chunk keeps only its input and re-runs
      all its layers in backward;
    - `block`: the first `num_layers` layers of the stage are checkpointed one by one (each keeps its input and
      re-runs alone), the rest keep their activations.

    The recipe composes these three keys and the memory model reads the same object, so the job and its
    memory verdict can never disagree (the model once assumed full recompute while the job ran none)."""

    method: str = "block"
    num_layers: int = 1


@dataclass(frozen=True)
class TrainParallel:
    """Megatron parallelism. `stage_layers` lists the decoder layers of every pipeline stage; megatron-core
    core_r0.12.1 (MindSpeed's line) can only express a uniform split or uneven first/last stages with a
    uniform middle (`num_layers_in_first/last_pipeline_stage`), which `validate_plan` enforces.
    `recompute` is the activation recompute the job runs (None: none)."""

    tp: int
    pp: int
    ep: int = 1
    etp: int = 1
    cp: int = 1
    stage_layers: tuple[int, ...] = ()
    recompute: Recompute | None = None

    @property
    def first_stage_layers(self) -> int | None:
        return self.stage_layers[0] if self.stage_layers else None

    @property
    def last_stage_layers(self) -> int | None:
        return self.stage_layers[-1] if self.stage_layers else None

    def dp(self, world_size: int) -> int:
        return world_size // (self.tp * self.pp * self.cp)

    @staticmethod
    def expressible_split(layers: tuple[int, ...]) -> tuple[int, ...] | None:
        """The split megatron-core core_r0.12.1 can run nearest to an uneven one (a fork's MindSpeed
        --num-layer-list): the same largest and last stage, the middle even, the first stage the rest; seed 002's
        7,7,8,8,8,8,8,7 gives 6,8,8,8,8,8,8,7, what verl's r1_ascend 671B A3 recipe runs. None when no such split
        exists (the first stage would be empty or larger than the middle)."""
        middle = layers[1:-1]
        if len(middle) < 1:
            return None
        even = max(middle)
        first = sum(layers) - layers[-1] - even * len(middle)
        return (first, *([even] * len(middle)), layers[-1]) if 0 < first <= even else None

    @staticmethod
    def uniform_middle(num_layers: int, pp: int, first: int, last: int) -> tuple[int, ...]:
        """Stage layers with given first/last stage and the rest spread evenly (Megatron's uneven PP)."""
        middle = num_layers - first - last
        if pp < 3 or middle % (pp - 2):
            raise PlanError(f"rule pp-uniform-middle: {middle} middle layers do not split evenly over {pp - 2} stages")
        return (first, *([middle // (pp - 2)] * (pp - 2)), last)


@dataclass(frozen=True)
class RolloutParallel:
    """vLLM parallelism of one rollout instance; instances = world / (tp * dp).
    With expert parallelism vLLM's EP group is the whole instance (ep == tp * dp)."""

    tp: int
    dp: int = 1
    ep: int = 1

    @property
    def instance_size(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class ParallelPlan:
    train: TrainParallel
    rollout: RolloutParallel


def _require(ok: bool, rule: str, detail: str) -> None:
    if not ok:
        raise PlanError(f"rule {rule}: {detail}")


def validate_plan(plan: ParallelPlan, model: ModelSpec, world_size: int) -> None:
    """Raise PlanError naming the first violated rule; return None for a valid plan."""
    t, r = plan.train, plan.rollout
    for name, value in (("tp", t.tp), ("pp", t.pp), ("ep", t.ep), ("etp", t.etp), ("cp", t.cp),
                        ("rollout.tp", r.tp), ("rollout.dp", r.dp), ("rollout.ep", r.ep), ("world_size", world_size)):
        _require(value >= 1, "positive", f"{name}={value} must be >= 1")
    model_parallel = t.tp * t.pp * t.cp
    _require(world_size % model_parallel == 0, "world-divisible",
             f"world size {world_size} is not divisible by tp*pp*cp = {t.tp}*{t.pp}*{t.cp} = {model_parallel}")
    _require(model.num_attention_heads % t.tp == 0, "tp-divides-heads",
             f"tp={t.tp} does not divide {model.num_attention_heads} attention heads")
    _require(model.n_routed_experts % t.ep == 0, "ep-divides-experts",
             f"ep={t.ep} does not divide {model.n_routed_experts} routed experts")
    # Megatron: expert parallel x expert tensor parallel must tile the non-pipeline ranks (tp*dp*cp).
    per_stage = world_size // t.pp
    _require(per_stage % (t.ep * t.etp) == 0, "ep-etp-divides-stage",
             f"ep*etp = {t.ep}*{t.etp} does not divide the {per_stage} ranks of a pipeline stage")
    _require(model.moe_intermediate_size % t.etp == 0, "etp-divides-expert-ffn",
             f"etp={t.etp} does not divide moe_intermediate_size {model.moe_intermediate_size}")
    if t.stage_layers:
        _require(len(t.stage_layers) == t.pp, "stage-count",
                 f"{len(t.stage_layers)} stage layer counts given for pp={t.pp}")
        _require(min(t.stage_layers) >= 1, "stage-nonempty", f"a pipeline stage has no layers: {list(t.stage_layers)}")
        _require(sum(t.stage_layers) == model.num_hidden_layers, "stage-layers-sum",
                 f"stage layers {list(t.stage_layers)} sum to {sum(t.stage_layers)}, "
                 f"model {model.name} has {model.num_hidden_layers}")
        # megatron-core core_r0.12.1 transformer_config.py __post_init__: only first/last stage counts, the
        # middle stages split the rest evenly (pipeline_model_parallel_layout arrives in core_r0.13).
        nearest = TrainParallel.expressible_split(t.stage_layers)
        _require(len(set(t.stage_layers[1:-1])) <= 1, "stage-layers-expressible",
                 f"stage layers {list(t.stage_layers)}: megatron-core 0.12 (MindSpeed core_r0.12.1) can only "
                 "make the first and last stage uneven; the middle stages must hold the same number of layers"
                 + (f"; {list(nearest)} keeps the largest and the last stage: num_layers_in_first_pipeline_stage="
                    f"{nearest[0]} num_layers_in_last_pipeline_stage={nearest[-1]}" if nearest else ""))
    else:
        _require(model.num_hidden_layers % t.pp == 0, "pp-divides-layers",
                 f"pp={t.pp} does not divide {model.num_hidden_layers} layers; give stage_layers")
    if t.recompute is not None:
        rc = t.recompute
        _require(rc.method in RECOMPUTE_METHODS, "recompute-method",
                 f"recompute method {rc.method!r} is not one of {', '.join(RECOMPUTE_METHODS)}")
        # megatron-core: recompute_num_layers must be between 1 and the layers of a pipeline rank
        most = max(t.stage_layers) if t.stage_layers else model.num_hidden_layers // t.pp
        _require(1 <= rc.num_layers <= most, "recompute-num-layers",
                 f"recompute num_layers={rc.num_layers} must be between 1 and the {most} layers of a stage")
    _require(world_size % r.instance_size == 0, "rollout-world-divisible",
             f"world size {world_size} is not divisible by the rollout instance tp*dp = {r.tp}*{r.dp} = "
             f"{r.instance_size}")
    _require(model.num_attention_heads % r.tp == 0, "rollout-tp-divides-heads",
             f"rollout tp={r.tp} does not divide {model.num_attention_heads} attention heads")
    _require(r.ep in (1, r.instance_size), "rollout-ep-is-instance",
             f"rollout ep={r.ep} must be 1 or the instance size tp*dp = {r.instance_size} (vLLM's EP group)")
    _require(model.n_routed_experts % r.ep == 0, "rollout-ep-divides-experts",
             f"rollout ep={r.ep} does not divide {model.n_routed_experts} routed experts")
