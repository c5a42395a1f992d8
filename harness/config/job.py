"""A job: a scale with the user's own recipe applied -- what `plan`, `memory`, `launch` and `doctor` all answer for.

`build_job(scale, user)` is the one code path: `plan --format verl-cli` prints `job.recipe`, `launch` submits it,
`memory` models `job.scale` (+ the memory knobs of `job.values`), the K8s manifest runs it.

- The user's overrides win over the scale's (harness.config.recipe.Recipe.with_overrides), then `--model-path` /
  `--data-dir`. The plan and batch the memory model and `validate_plan` see are read back from the merged overrides
  (`derive_scale`), so the job and its verdicts cannot disagree.
- Keys of cann-recipes-train's verl fork that seed 002's script uses and verl 0.9.1 spells differently are read as
  what they mean and translated (LEGACY_KEYS), each with a note; the fork's other keys stay and `--validate` names
  them as unknown to verl 0.9.1.
- At the tiny scale the recipe is rehearsed (`rehearsal`): the user's algorithm settings (REHEARSED) run on verl's
  real trainer on CPU, the model, lengths, batch, parallelism and hardware are the tiny scale's own (read from
  harness.config.scales / cpu_tier, never copied here).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.config import recipe as recipes
from harness.config.plans import Recompute, RolloutParallel, TrainParallel
from harness.config.recipe import Recipe, path_overrides
from harness.config.scales import Scale
from harness.config.user_recipe import UserRecipe, split_override
from harness.errors import BadInput, PlanError

_A, _RO, _MG = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.megatron"
_TC = f"{_MG}.override_transformer_config"
FIRST_STAGE, LAST_STAGE = f"{_TC}.num_layers_in_first_pipeline_stage", f"{_TC}.num_layers_in_last_pipeline_stage"
RECOMPUTE = {"granularity": f"{_TC}.recompute_granularity", "method": f"{_TC}.recompute_method",
             "num_layers": f"{_TC}.recompute_num_layers"}
# cann-recipes-train's verl fork (llm_rl/deepseek/verl_patches/trainer/config/ppo_mindspeed_trainer.yaml, the config
# seed 002's script composes in) -> verl 0.9.1 (trainer/config/engine/megatron.yaml override_transformer_config).
FORK_STAGE_LIST = f"{_MG}.pipeline_parallel_num_layer_list"
_FORK_CKPT = "actor_rollout_ref.model.gradient_checkpointing_kwargs.activations_checkpoint_"
LEGACY_KEYS = {f"{_FORK_CKPT}granularity": RECOMPUTE["granularity"], f"{_FORK_CKPT}method": RECOMPUTE["method"],
               f"{_FORK_CKPT}num_layers": RECOMPUTE["num_layers"]}
LEGACY_SOURCE = "cann-recipes-train llm_rl/deepseek/verl_patches/trainer/config/ppo_mindspeed_trainer.yaml"

# The algorithm of a recipe: what a tiny rehearsal keeps (advantage estimator, KL loss or KL in reward, clip ratios,
# loss aggregation, entropy, epochs, samples per prompt, sampling, rollout correction, reward manager and shaping).
REHEARSED = tuple(re.compile(p) for p in (
    r"algorithm\..+",
    rf"{re.escape(_A)}\.(use_kl_loss|kl_loss_coef|kl_loss_type|clip_ratio|clip_ratio_low|clip_ratio_high|"
    r"clip_ratio_c|loss_agg_mode|entropy_coeff|ppo_epochs|policy_loss\..+)",
    rf"{re.escape(_RO)}\.(n|temperature|top_p|top_k|do_sample|calculate_log_probs)",
    r"critic\.(cliprange_value|ppo_epochs|loss_agg_mode)",
    r"reward\.reward_manager\..+",
    r"reward\.reward_kwargs\.overlong_buffer_cfg\.(enable|penalty_factor|log)",
))
# Scaled with the response length at tiny scale: the overlong buffer's share of the response stays the user's.
OVERLONG_LEN = "reward.reward_kwargs.overlong_buffer_cfg.len"
MAX_RESP_LEN = "reward.reward_kwargs.max_resp_len"


@dataclass(frozen=True)
class Job:
    """A scale with the user's recipe applied."""

    scale: Scale  # the plan and batch the job runs (read back from `values`)
    recipe: Recipe  # what runs: `env python3 -m entrypoint overrides`
    user: UserRecipe | None = None
    read: tuple[str, ...] = ()  # what was read from the user's recipe into the plan / batch
    notes: tuple[str, ...] = ()  # parse notes, translations, what a rehearsal scaled down
    plan_error: str | None = None  # the plan rule the job breaks (validate_plan), or None
    unmodelled: tuple[str, ...] = ()  # what the plan could not express for the memory model
    values: Mapping[str, str] = field(default_factory=dict)  # merged override key -> value (before translation)

    @property
    def env(self) -> Mapping[str, str]:
        return self.recipe.env


def build_job(scale: Scale, user: UserRecipe | None = None, *, model_path: str | None = None,
              data_dir: str | None = None) -> Job:
    """The job of `scale` with the user's recipe (see the module docstring); `model_path` / `data_dir` win over
    both."""
    if scale.tier == "tiny" and user is not None:
        return rehearsal(scale, user, model_path=model_path, data_dir=data_dir)
    base = recipes.dapo_recipe(scale, model_path=model_path, data_dir=data_dir)
    if user is None:
        return Job(scale=scale, recipe=base, values=base.override_map())
    notes = list(user.notes)
    merged = base.with_overrides(user.overrides, user.env).with_overrides(
        path_overrides(model_path=model_path, data_dir=data_dir))
    merged = _keep_file_logger(merged, notes)
    if user.entrypoint and user.entrypoint != merged.entrypoint:
        merged = dataclasses.replace(merged, entrypoint=user.entrypoint)
    values = merged.override_map()
    derived = derive_scale(scale, values)
    plan_error = derived.problems[0] if derived.problems else _plan_error(derived.scale)
    return Job(scale=derived.scale, recipe=translate_legacy(merged, values, notes), user=user,
               read=tuple(derived.read), notes=tuple(notes), plan_error=plan_error,
               unmodelled=tuple(derived.unmodelled), values=values)


def _plan_error(scale: Scale) -> str | None:
    try:
        scale.validate()
    except PlanError as exc:
        return str(exc)
    return None


@dataclass
class Derived:
    """What `derive_scale` read from the overrides."""

    scale: Scale
    read: list[str] = field(default_factory=list)  # `key=value` it used
    problems: list[str] = field(default_factory=list)  # plan rules the overrides break before validate_plan runs
    unmodelled: list[str] = field(default_factory=list)  # settings the plan cannot express


def _keep_file_logger(recipe: Recipe, notes: list[str]) -> Recipe:
    """verl's FileLogger writes the metrics.jsonl the harness reads (progress, abort-on-fail, the suites): a
    `trainer.logger` without `file` gets it appended."""
    logger = recipe.override_map().get("trainer.logger", "")
    items = [x.strip().strip("'\"") for x in logger.strip("[]").split(",") if x.strip()]
    if "file" in items:
        return recipe
    notes.append(f"trainer.logger={logger}: `file` appended (the harness reads verl's FileLogger metrics.jsonl)")
    return recipe.with_overrides([f"trainer.logger=[{','.join([*items, 'file'])}]"])


def translate_legacy(recipe: Recipe, values: Mapping[str, str], notes: list[str]) -> Recipe:
    """The fork's keys in LEGACY_KEYS (and the stage list) as verl 0.9.1's overrides, a note for each."""
    out = []
    for key, target in LEGACY_KEYS.items():
        if key in values:
            out += [f"~{key}", f"{target}={values[key]}"]
            notes.append(f"{key} ({LEGACY_SOURCE}) read as {target}")
    if FORK_STAGE_LIST in values:
        layers = _int_list(FORK_STAGE_LIST, values[FORK_STAGE_LIST])
        out.append(f"~{FORK_STAGE_LIST}")
        if len(layers) >= 2:
            out += [f"+{FIRST_STAGE}={layers[0]}", f"+{LAST_STAGE}={layers[-1]}"]
        notes.append(f"{FORK_STAGE_LIST}={values[FORK_STAGE_LIST]} ({LEGACY_SOURCE}; MindSpeed's --num-layer-list) "
                     f"read as the stage split; verl 0.9.1 takes only {FIRST_STAGE.rsplit('.', 1)[-1]} / "
                     f"{LAST_STAGE.rsplit('.', 1)[-1]}")
    return recipe.with_overrides(out) if out else recipe


# ---------------------------------------------------------------------------------------------------- read back

def _value(key: str, text: str | None):
    """An override value as Hydra reads a plain one: null, a bool, an int, a float, or the string."""
    if text is None:
        return None
    t = text.strip().strip("'\"")
    if t.lower() in ("null", "none", "~", ""):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


# Bounds of every size a recipe sets, checked before anything is built from it: tp=0 and trainer.nnodes=0 were
# ZeroDivisionError tracebacks, tp=10**23 one too, ep=10**23 and rollout.n=0 a memory PASS / a valid plan, and
# pipeline_model_parallel_size=1e9 built a list of 1e9 stages. 2**16 devices in one parallel group, node or job is
# beyond any cluster the harness targets (A2 256 cards, A3 128 cards x 2 dies); a batch, a group or a length stays
# within what verl's dataloader and vLLM's scheduler take as one step.
MAX_PARALLEL = 2**16  # tp, pp, ep, etp, cp and the rollout's tp/dp/ep; nodes
MAX_DEVICES_PER_NODE = 256
MAX_BATCH = 2**20  # prompts per step, per mini batch, per micro batch
MAX_GROUP = 2**12  # samples per prompt (rollout.n)
MAX_TOKENS = 2**24  # prompt / response length


def _int(key: str, text: str | None, default: int | None = None, *, low: int | None = None,
         high: int | None = None) -> int | None:
    """A whole-number override, or `default` when unset; BadInput naming the override when it is not one, or when it
    lies outside [low, high]."""
    value = _value(key, text)
    if value is None:
        return default
    if type(value) is not int:
        raise BadInput(f"override {key}={str(text)[:40]}: a whole number expected")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadInput(f"override {key}={str(text)[:40]}: must be a whole number in [{low}, {high}]")
    return value


def _size(key: str, text: str | None, default: int | None, high: int = MAX_PARALLEL) -> int | None:
    return _int(key, text, default, low=1, high=high)


def _int_list(key: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.strip().strip("[]").split(",") if x.strip())
    except ValueError:
        raise BadInput(f"override {key}={text}: a list of whole numbers expected ([7,7,8,...])") from None


def derive_scale(scale: Scale, values: Mapping[str, str]) -> Derived:
    """`scale` with the parallel plan, batch, devices and rollout switches the overrides set (the merged map of a
    job: the scale's own overrides and the user's), what was read, and the problems met."""
    out = Derived(scale)
    read = out.read

    def get(key: str):
        if key in values:
            read.append(f"{key}={values[key]}")
            return values[key]
        return None

    t, r, b = scale.plan.train, scale.plan.rollout, scale.batch
    tp = _size(f"{_MG}.tensor_model_parallel_size", get(f"{_MG}.tensor_model_parallel_size"), t.tp)
    pp = _size(f"{_MG}.pipeline_model_parallel_size", get(f"{_MG}.pipeline_model_parallel_size"), t.pp)
    ep = _size(f"{_MG}.expert_model_parallel_size", get(f"{_MG}.expert_model_parallel_size"), t.ep)
    # Megatron: expert_tensor_parallel_size None means "= tensor_model_parallel_size"
    etp = _size(f"{_MG}.expert_tensor_parallel_size", get(f"{_MG}.expert_tensor_parallel_size"), None)
    etp = etp if etp is not None else (t.etp if f"{_MG}.expert_tensor_parallel_size" not in values else tp)
    cp = _size(f"{_MG}.context_parallel_size", get(f"{_MG}.context_parallel_size"), t.cp)
    stages = _stage_layers(scale, pp, values, get, out)
    train = TrainParallel(tp, pp, ep, etp, cp, stages, _recompute(t.recompute, values, get, out))
    rollout = RolloutParallel(_size(f"{_RO}.tensor_model_parallel_size", get(f"{_RO}.tensor_model_parallel_size"),
                                    r.tp),
                              _size(f"{_RO}.data_parallel_size", get(f"{_RO}.data_parallel_size"), r.dp),
                              _size(f"{_RO}.expert_parallel_size", get(f"{_RO}.expert_parallel_size"), r.ep))
    gbs = _size("data.train_batch_size", get("data.train_batch_size"), b.gbs, MAX_BATCH)
    batch = dataclasses.replace(
        b, gbs=gbs, n=_size(f"{_RO}.n", get(f"{_RO}.n"), b.n, MAX_GROUP),
        max_prompt_length=_size("data.max_prompt_length", get("data.max_prompt_length"), b.max_prompt_length,
                                MAX_TOKENS),
        max_response_length=_size("data.max_response_length", get("data.max_response_length"),
                                  b.max_response_length, MAX_TOKENS),
        ppo_mini_batch_size=_size(f"{_A}.ppo_mini_batch_size", get(f"{_A}.ppo_mini_batch_size"),
                                  b.ppo_mini_batch_size or gbs, MAX_BATCH),
        micro_batch_size_per_device=_size(f"{_A}.ppo_micro_batch_size_per_gpu",
                                          get(f"{_A}.ppo_micro_batch_size_per_gpu"), b.micro_batch_size_per_device,
                                          MAX_BATCH),
        overlong_buffer_len=_int(OVERLONG_LEN, get(OVERLONG_LEN), b.overlong_buffer_len, low=0, high=MAX_TOKENS))
    nodes = _size("trainer.nnodes", get("trainer.nnodes"), scale.nodes)
    per_node = _size("trainer.n_gpus_per_node", get("trainer.n_gpus_per_node"), scale.devices_per_node,
                     MAX_DEVICES_PER_NODE)
    eager = _value(f"{_RO}.enforce_eager", get(f"{_RO}.enforce_eager"))
    chunked = _value(f"{_RO}.enable_chunked_prefill", get(f"{_RO}.enable_chunked_prefill"))
    load_format = _value(f"{_RO}.load_format", get(f"{_RO}.load_format"))
    out.scale = dataclasses.replace(
        scale, devices=nodes * per_node, nodes=nodes, plan=dataclasses.replace(scale.plan, train=train,
                                                                                 rollout=rollout),
        batch=batch, graph_mode=scale.graph_mode if eager is None else not eager,
        chunked_prefill=scale.chunked_prefill if chunked is None else bool(chunked),
        load_format=scale.load_format if load_format is None else str(load_format))
    return out


def _stage_layers(scale: Scale, pp: int, values: Mapping[str, str], get, out: Derived) -> tuple[int, ...]:
    """The per-stage layer counts the overrides ask for: the fork's full list, else Megatron's first/last stage
    counts with the middle stages even (megatron-core core_r0.12.1 TransformerConfig), else uniform."""
    if FORK_STAGE_LIST in values:
        return _int_list(FORK_STAGE_LIST, get(FORK_STAGE_LIST))
    first = _int(FIRST_STAGE, get(FIRST_STAGE), low=0, high=MAX_PARALLEL)
    last = _int(LAST_STAGE, get(LAST_STAGE), low=0, high=MAX_PARALLEL)
    if first is None and last is None:
        return ()
    layers = scale.model.num_hidden_layers
    middle = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle < 1 or rest % middle:
        out.problems.append(f"rule stage-layers-expressible: {FIRST_STAGE.rsplit('.', 1)[-1]}={first}, "
                            f"{LAST_STAGE.rsplit('.', 1)[-1]}={last} leave {rest} of {layers} layers for {middle} "
                            f"middle stage(s) of pp={pp}: Megatron splits them evenly, and they do not split")
        return ()
    even = rest // middle
    return (*((first,) if first is not None else ()), *([even] * middle), *((last,) if last is not None else ()))


def _recompute(default: Recompute | None, values: Mapping[str, str], get, out: Derived) -> Recompute | None:
    """The activation recompute of verl 0.9.1's override_transformer_config keys, or the fork's equivalents."""
    def pick(name: str):
        # the fork's key first: only a user's recipe has it, and the user's settings win over the scale's
        for key in (*(k for k, v in LEGACY_KEYS.items() if v == RECOMPUTE[name]), RECOMPUTE[name]):
            if key in values:
                return key, _value(key, get(key))
        return None, None

    keys = [pick(n) for n in ("granularity", "method", "num_layers")]
    if not any(k for k, _ in keys):
        return default
    (gkey, granularity), (mkey, method), (nkey, num_layers) = keys
    if granularity is None:
        return None
    if granularity != "full":
        # selective recompute (core attention only) is not what harness.memory models: say so, model none
        out.unmodelled.append(f"{gkey}={granularity}: only full recompute or none is modelled (modelled: none)")
        return None
    method = method or (default.method if default else "uniform")
    num_layers = num_layers if num_layers is not None else (default.num_layers if default else 1)
    if type(num_layers) is not int:
        raise BadInput(f"override {nkey}={num_layers}: a whole number expected")
    return Recompute(method=str(method), num_layers=num_layers)


# ---------------------------------------------------------------------------------------------------- tiny rehearsal

def rehearsed(key: str) -> bool:
    return any(p.fullmatch(key) for p in REHEARSED)


def rehearsal(tiny: Scale, user: UserRecipe, *, model_path: str | None = None, data_dir: str | None = None) -> Job:
    """The user's algorithm at the tiny scale: the tiny scale's recipe (model, lengths, batch, parallelism, CPU
    tier) with the user's REHEARSED overrides; the prompts per step shrink so prompts x samples stays the tiny
    scale's when the recipe samples more per prompt; the overlong buffer keeps its share of the response."""
    values = user.override_map()
    n = _int(f"{_RO}.n", values.get(f"{_RO}.n"), tiny.batch.n)
    if n < 1:
        raise BadInput(f"override {_RO}.n={n}: at least one sample per prompt")
    gbs = max(1, tiny.batch.sequences // n)
    scale = dataclasses.replace(tiny, batch=dataclasses.replace(tiny.batch, n=n, gbs=gbs, ppo_mini_batch_size=gbs))
    base = recipes.dapo_recipe(scale, model_path=model_path, data_dir=data_dir)
    kept, dropped = [], []
    user_response = _int("data.max_response_length", values.get("data.max_response_length"))
    for override in user.overrides:
        key, value = split_override(override, user.source)
        if key == OVERLONG_LEN and value is not None and user_response:
            share = _int(key, value) / user_response
            kept.append(f"+{key}={max(1, round(share * scale.batch.max_response_length))}")
        elif key == MAX_RESP_LEN:
            continue  # the tiny scale's own (dapo_recipe writes it)
        elif rehearsed(key):
            kept.append(override)
        else:
            dropped.append(key)
    notes = list(user.notes)
    if dropped:
        shown = ", ".join(dropped[:6]) + (f" and {len(dropped) - 6} more" if len(dropped) > 6 else "")
        notes.append(f"rehearsed at tiny scale: {len(dropped)} override(s) of model, data, lengths, batch, "
                     f"parallelism and hardware are the tiny scale's ({shown})")
    if user.env:
        notes.append(f"rehearsed at tiny scale: the recipe's environment ({', '.join(sorted(user.env)[:6])}"
                     f"{' ...' if len(user.env) > 6 else ''}) is the CPU tier's")
    if n != tiny.batch.n:
        notes.append(f"rehearsed at tiny scale: {n} samples per prompt, so {gbs} prompts per step "
                     f"({gbs * n} sequences, the tiny scale's {tiny.batch.sequences})")
    recipe = base.with_overrides(kept)
    return Job(scale=scale, recipe=recipe, user=user, read=tuple(kept), notes=tuple(notes),
               values=recipe.override_map())
