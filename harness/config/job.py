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
from pathlib import Path

from harness.config import recipe as recipes
from harness.config.models import ModelSpec
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
# The fork's MindSpeed swap optimizer (ppo_mindspeed_trainer.yaml `megatron.swap_optimizer: False`, read by its
# train_engine/initialize_training.py): the memory model reads it (harness.memory.job_options SWAP_OPTIMIZER_KEYS)
FORK_SWAP_OPTIMIZER = f"{_MG}.swap_optimizer"

# The algorithm of a recipe: what a tiny rehearsal keeps (advantage estimator, KL loss or KL in reward, clip ratios,
# loss aggregation, entropy, epochs, samples per prompt, sampling, rollout correction, reward manager and shaping).
# The fork keys the harness reads (cann-recipes-train's ppo_mindspeed_trainer.yaml): known to the harness, not to
# verl's own config, so a tiny rehearsal drops them as the fork's, never as a typo (seed 002's KL rehearsal was
# refused on swap_optimizer, and its test skipped, for a night).
FORK_KEYS = frozenset({*LEGACY_KEYS, FORK_STAGE_LIST, FORK_SWAP_OPTIMIZER})
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


# Legacy sections verl 0.9.1's main_ppo reads nowhere: only the experimental fully_async_main moves them into
# `reward` (verl 0.9.1 verl/experimental/reward_loop/reward_loop.py migrate_legacy_reward_impl, called by
# verl/experimental/fully_async_policy/fully_async_main.py alone). Composed and validated, then ignored: the 671B DAPO
# script's reward_model.reward_manager=dapo and overlong shaping ran as verl's default reward (issue 44).
IGNORED_BY_MAIN_PPO = re.compile(r"(reward_model|custom_reward_function|sandbox_fusion)\.(.+)")
# legacy key -> where verl 0.9.1 reads it (migrate_legacy_reward_impl's own mapping)
MIGRATED = ((re.compile(r"reward_model\.reward_manager"), "reward.reward_manager.name"),
            (re.compile(r"reward_model\.reward_kwargs\.(.+)"), r"reward.reward_kwargs.\1"),
            (re.compile(r"reward_model\.model\.path"), "reward.reward_model.model_path"),
            (re.compile(r"reward_model\.(enable|enable_resource_pool|n_gpus_per_node|nnodes|num_workers)"),
             r"reward.reward_model.\1"),
            (re.compile(r"custom_reward_function\.(.+)"), r"reward.custom_reward_function.\1"),
            (re.compile(r"sandbox_fusion\.(.+)"), r"reward.sandbox_fusion.\1"))


def ignored_keys(entrypoint: str, keys) -> list[str]:
    """The keys of `keys` verl's main_ppo ignores (IGNORED_BY_MAIN_PPO), each with where verl reads it now."""
    if entrypoint != recipes.ENTRYPOINT:
        return []
    out = []
    for key in keys:
        if IGNORED_BY_MAIN_PPO.fullmatch(key):
            new = next((p.sub(target, key) for p, target in MIGRATED if p.fullmatch(key)), None)
            out.append(key + (f" (verl reads {new})" if new else ""))
    return out


@dataclass(frozen=True)
class Change:
    """One override the reduced tier changes in a recipe: `key` from `before` to `after` (None: unset / removed)."""

    key: str
    before: str | None
    after: str | None
    why: str

    def line(self) -> str:
        return (f"reduced: {self.key} {self.before if self.before is not None else '(unset)'} -> "
                f"{self.after if self.after is not None else '(removed)'} ({self.why})")

    def to_json(self) -> dict:
        # "override", not "key": the report masks the value of any field named as a secret (harness.redact)
        return {"override": self.key, "from": self.before, "to": self.after, "why": self.why}


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
    origins: Mapping[str, str] = field(default_factory=dict)  # final override key -> "recipe" / "scale" / "harness"
    warnings: tuple[str, ...] = ()  # a scale / harness value that changes the model, engine, algorithm or a length
    engine: str = "megatron"
    ignored: tuple[str, ...] = ()  # the user's keys verl's trainer composes and then ignores (IGNORED_BY_MAIN_PPO)
    reduction: tuple[Change, ...] = ()  # the reduced tier: what bringing the recipe up on one node changed (reduce)

    @property
    def env(self) -> Mapping[str, str]:
        return self.recipe.env


def build_job(scale: Scale, user: UserRecipe | None = None, *, model_path: str | None = None,
              data_dir: str | None = None) -> Job:
    """The job of `scale` with the user's recipe (see the module docstring); `model_path` / `data_dir` win over
    both."""
    if scale.tier == "tiny" and user is not None:
        return rehearsal(scale, user, model_path=model_path, data_dir=data_dir)
    if scale.tier == "reduced" and user is not None:
        return reduce(scale, user, model_path=model_path, data_dir=data_dir)
    return _build(scale, user, model_path=model_path, data_dir=data_dir)


def _build(scale: Scale, user: UserRecipe | None, *, model_path: str | None, data_dir: str | None) -> Job:
    base = recipes.dapo_recipe(scale, model_path=model_path, data_dir=data_dir)
    if user is None:
        values = base.override_map()
        return Job(scale=scale, recipe=base, values=values, origins=dict.fromkeys(values, "scale"))
    notes = list(user.notes)
    script = user.entrypoint is not None  # a whole job (a launch script), not overrides of the scale's job
    user_keys = set(user.override_map())
    if script:
        check_trains(user)
    engine = engine_of(user.override_map()) if script else "megatron"
    if script and engine != "megatron":
        raise BadInput(f"--recipe {user.source}: its engine is {engine} ({_ENGINE_EVIDENCE[engine]}); the harness "
                       "plans Megatron jobs only (its parallel plan and memory model are Megatron's), and planning it "
                       "as one would describe another job")
    if script:
        try:
            scale, base, dropped = _recipe_base(scale, base, user_keys, user.override_map(), notes, model_path)
        except BadInput as exc:
            raise BadInput(f"--recipe {user.source}: {exc}") from None
        device = (user.override_map().get("trainer.device") or "").strip("'\"")
        if device != "npu":
            notes.append(f"trainer.device={device or 'cuda (verl default)'}: verl runs it as npu on an Ascend host "
                         "(verl v0.9.0 verl/utils/device.py auto_set_device, called by main_ppo.main and verl-recipe "
                         "dapo/main_dapo.py); planned on the Atlas hardware of the scale")
        fork = _fork_rollout(user, notes)
        if fork:
            user = dataclasses.replace(user, overrides=user.overrides + tuple(fork))
            user_keys |= {split_override(o)[0] for o in fork}
    merged = base.with_overrides(user.overrides, user.env).with_overrides(
        path_overrides(model_path=model_path, data_dir=data_dir))
    merged = _keep_file_logger(merged, notes)
    if user.entrypoint and user.entrypoint != merged.entrypoint:
        merged = dataclasses.replace(merged, entrypoint=user.entrypoint)
    values = merged.override_map()
    base_keys = set(base.override_map())
    origins = {k: "recipe" if k in user_keys else "scale" if k in base_keys else "harness" for k in values}
    for key in (path_overrides(model_path=model_path, data_dir=data_dir)):
        origins[split_override(key)[0]] = "harness"
    if "trainer.logger" in values and values["trainer.logger"] != user.override_map().get("trainer.logger",
                                                                                         values["trainer.logger"]):
        origins["trainer.logger"] = "harness"
    derived = derive_scale(scale, values)
    check_world(derived.scale, user.source)
    plan_error = derived.problems[0] if derived.problems else _plan_error(derived.scale)
    warnings = _changes(values, origins, scale.name) if script else ()
    ignored = ignored_keys(merged.entrypoint, user_keys)
    if ignored:
        notes.append(f"verl {recipes.verl_release()}'s main_ppo ignores {len(ignored)} legacy key(s) (only its "
                     f"fully_async_main migrates them): {'; '.join(ignored)}")
    recipe = translate_legacy(merged, values, notes)
    for key in recipe.override_map():
        origins.setdefault(key, "harness")  # a translated fork key
    return Job(scale=derived.scale, recipe=recipe, user=user, read=tuple(derived.read), notes=tuple(notes),
               plan_error=plan_error, unmodelled=tuple(derived.unmodelled), values=values, origins=origins,
               warnings=tuple(warnings), engine=engine, ignored=tuple(ignored))


# ---------------------------------------------------------------------------------------------------- the recipe's job

# What a launch script's job is, whatever the scale's (issue 30: a GRPO gsm8k script became DAPO with the scale's
# filter groups and an overlong buffer sized for 8192; rollout TP32 kept the scale's EP64; the Moonlight example was
# planned as DSV3 671B on 256 dies).
_MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")
_LENGTH_KEYS = ("data.max_prompt_length", "data.max_response_length", f"{_RO}.max_model_len", OVERLONG_LEN,
                MAX_RESP_LEN)
_ENGINE_KEYS = ("model_engine", f"{_A}.strategy")
_PARALLEL = re.compile(rf"({re.escape(_MG)}\.(tensor|pipeline|expert|expert_tensor|context)_(model_)?parallel_size|"
                       rf"{re.escape(_RO)}\.(tensor_model|data|expert)_parallel_size|{re.escape(_TC)}\..*)")
# verl 0.9.1's other engine groups (trainer/config/engine/*.yaml): a job on one is refused as that engine's (issue 44:
# a veomni job was refused as "its engine is fsdp")
OTHER_ENGINES = ("veomni", "automodel", "torchtitan")
_ENGINE_EVIDENCE = {"fsdp": "actor_rollout_ref.actor.strategy=fsdp/fsdp2, fsdp_config keys, or no Megatron setting: "
                            "verl's ppo_trainer runs FSDP by default",
                    **{e: f"model_engine={e} or actor_rollout_ref.actor.strategy={e}" for e in OTHER_ENGINES}}
# Entrypoints that train nothing: verl 0.9.1 verl/trainer/main_generation_server.py and main_eval.py (older verl:
# main_generation.py). A generation job was refused as "names no model" (issue 44): its model is `model.path`.
GENERATION_ENTRYPOINTS = ("verl.trainer.main_generation", "verl.trainer.main_generation_server",
                          "verl.trainer.main_eval")
# Model ids (the directory name of actor_rollout_ref.model.path) the harness models; a directory holding a
# config.json is read instead (harness.config.models.ModelSpec fields are HF config keys). A distilled model is its
# student's architecture, whatever its teacher's name (issue 44: DeepSeek-R1-Distill-Qwen-1.5B planned as 671B).
KNOWN_MODELS = ((re.compile(r"deepseek[-_]?(v3|r1)(?!.*distill)", re.I), "deepseek-v3"),
                (re.compile(r"moonlight[-_]?16b", re.I), "moonlight-16b-a3b"))
MLA_MODEL_TYPES = ("deepseek_v3", "kimi_k2")  # DeepSeek-V3 architecture (MLA + MoE); Kimi-K2 is one


def scale_for_recipe(user: UserRecipe | None, model_path: str | None = None) -> Scale:
    """The base of a launch script's job planned without --scale: the registered scale of its model's family, on the
    Atlas hardware its n_gpus_per_node names (a node of 16 devices is an A3 node of 8 cards of 2 dies, one of 8 an A2
    node); the recipe's own settings then win (build_job). BadInput when the recipe does not say enough."""
    from harness.config.hardware import PROFILES
    from harness.config.scales import SCALES

    if user is None or user.entrypoint is None:
        raise BadInput("plan: give --scale, or --recipe with a launch script whose job is planned as written")
    check_trains(user)
    values = user.override_map()
    engine = engine_of(values)
    if engine in OTHER_ENGINES:
        raise BadInput(f"--recipe {user.source}: its engine is {engine} ({_ENGINE_EVIDENCE[engine]}); the harness "
                       "plans Megatron jobs only")
    try:
        model = recipe_model(values, model_path)
    except BadInput as exc:
        raise BadInput(f"--recipe {user.source}: {exc}") from None
    if model is None:
        raise BadInput(f"--recipe {user.source}: it names no model (actor_rollout_ref.model.path): pass --model-path, "
                       "or --scale to plan it as a scale's model")
    # trainer.device is no evidence of the hardware: verl sets it to npu on an Ascend host whatever the recipe says
    # (build_job notes it), so the node size alone picks the Atlas profile
    per_node = _int("trainer.n_gpus_per_node", values.get("trainer.n_gpus_per_node"), 8)
    hardware = PROFILES["a3" if per_node == 16 else "a2"]
    family = "moonlight-a2" if model.name.startswith("moonlight") else "full-a3" if hardware.name == "a3" else \
        "full-a2-gbs128"
    scale = SCALES[family]
    return dataclasses.replace(scale, model=model, hardware=hardware)


def check_trains(user: UserRecipe) -> None:
    """BadInput naming the true cause when a launch script runs no RL trainer (a generation or evaluation job)."""
    if user.entrypoint in GENERATION_ENTRYPOINTS:
        raise BadInput(f"--recipe {user.source}: it runs python3 -m {user.entrypoint}, a generation job that trains "
                       "nothing; the harness plans RL training jobs (verl.trainer.main_ppo and its recipes)")


def engine_of(values: Mapping[str, str | None]) -> str:
    """"megatron", "fsdp" or one of OTHER_ENGINES: what verl 0.9.1 runs for these overrides (ppo_trainer's default
    engine is FSDP; `model_engine=megatron`, `--config-name ppo_megatron_trainer` or `actor.strategy=megatron` select
    Megatron)."""
    engine, strategy = values.get("model_engine"), values.get(f"{_A}.strategy")
    other = next((e for e in OTHER_ENGINES if e in (engine, strategy)), None)
    if other:
        return other
    if engine == "megatron" or strategy == "megatron":
        return "megatron"
    if strategy in ("fsdp", "fsdp2") or engine in ("fsdp", "fsdp2"):
        return "fsdp"
    if any(".megatron." in k for k in values):
        return "megatron"
    return "fsdp"


def model_of(path: str | None) -> tuple[ModelSpec | None, str]:
    """The model a recipe's actor_rollout_ref.model.path names: its config.json when the directory holds one, else
    the directory's name in KNOWN_MODELS; (None, name) for a model the harness does not model."""
    from harness.config.models import MODELS

    if not path:
        return None, ""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    config = Path(path) / "config.json"
    if "${" not in path and config.is_file():
        return _spec_from_config(config, name), name
    if name in MODELS:  # a registered model's own directory (models/deepseek-v3-4l: the reduced scale's 4 layers)
        return MODELS[name], name
    for pattern, model in KNOWN_MODELS:
        if pattern.search(name):
            return MODELS[model], name
    return None, name


def _spec_from_config(config: Path, name: str) -> ModelSpec:
    from harness.config.models import ModelSpec, YarnRope
    from harness.io import read_json

    doc = read_json(config, missing="cannot read the model's config.json")
    model_type = doc.get("model_type") if isinstance(doc, dict) else None
    if model_type not in MLA_MODEL_TYPES:
        raise BadInput(f"{config}: model_type {model_type!r} is not a model the harness models (DeepSeek-V3 "
                       f"architecture: {', '.join(MLA_MODEL_TYPES)}); plan and memory would describe another job")
    fields = {f.name for f in dataclasses.fields(ModelSpec)} - {"name", "rope_scaling", "hf_id"}
    values = {k: doc[k] for k in fields if k in doc}
    rope = doc.get("rope_scaling") or doc.get("rope_parameters")
    yarn = None
    if isinstance(rope, dict) and rope.get("type", rope.get("rope_type")) == "yarn":
        yarn = YarnRope(**{k: rope[k] for k in ("factor", "original_max_position_embeddings", "mscale",
                                                "mscale_all_dim", "beta_fast", "beta_slow") if k in rope})
    try:
        return ModelSpec(name=name.lower(), rope_scaling=yarn, **values)
    except TypeError as exc:
        raise BadInput(f"{config}: not a whole DeepSeek-V3-architecture config ({exc})") from None


# Model families of another architecture, told by their directory's name when it holds no config.json (a distilled
# DeepSeek-R1 is its student's: DeepSeek-R1-Distill-Qwen-1.5B is a Qwen2)
OTHER_FAMILIES = re.compile(r"qwen|llama|mistral|mixtral|gemma|phi-?\d|glm|internlm|baichuan|distill", re.I)


def is_mla(values: Mapping[str, str | None], model_path: str | None = None) -> bool | None:
    """Whether the job's model is DeepSeek-V3's architecture (MLA + MoE), from its config.json, else its name; None
    when the recipe does not say (no path, a placeholder, a path only its shell knows, a name nobody knows)."""
    path = model_path or values.get("actor_rollout_ref.model.path")
    if not path or "${" in path or re.search(r"<[^<>]*>", path):
        return None
    try:
        spec, name = model_of(path)
    except BadInput:  # a config.json of another model_type
        return False
    if spec is not None:
        return True
    return False if OTHER_FAMILIES.search(name) else None


def recipe_model(values: Mapping[str, str | None], model_path: str | None = None) -> ModelSpec | None:
    """The model a recipe trains (--model-path wins), None when it names none; BadInput, one line, when it names a
    placeholder, a path only the running shell knows, or a model the harness does not model: planning any of them
    as a scale's DSV3 would describe another job."""
    path = model_path or values.get("actor_rollout_ref.model.path")
    model, name = model_of(path)
    if path and model is None:
        key = "--model-path" if model_path else "actor_rollout_ref.model.path"
        if re.search(r"<[^<>]*>", path):
            raise BadInput(f"{key}={path} is a placeholder: write the model's directory there (or pass --model-path)")
        if "${" in name:
            # upstream's Moonlight gsm8k example passes an unset $LLM
            raise BadInput(f"{key}={path}: the model is only known when the job runs; pass --model-path")
        raise BadInput(f"model {name} ({key}={path}) is not a model the harness models (DeepSeek-V3/R1, "
                       "Moonlight-16B-A3B, or a directory whose config.json is model_type "
                       f"{'/'.join(MLA_MODEL_TYPES)}); plan and memory would describe another job")
    return model


def _recipe_base(scale: Scale, base: Recipe, user_keys: set[str], values: Mapping[str, str | None],
                 notes: list[str], model_path: str | None = None) -> tuple[Scale, Recipe, list[str]]:
    """The scale's job reduced to what a launch script leaves unset and the scale may fill (hardware, batch, world):
    not its model, algorithm or parallel sizes, which are the recipe's (verl's defaults where it sets none)."""
    model = recipe_model(values, model_path)
    if model is None:
        notes.append(f"the recipe names no model (actor_rollout_ref.model.path); planned as the scale's "
                     f"{scale.model.name}")
    else:
        # verl 0.9.1's defaults for every size the recipe does not set, never the scale's (rollout TP32 kept the
        # scale's EP64): trainer/config/engine/megatron.yaml sizes 1, expert_tensor_parallel_size null (= TP),
        # recompute null; rollout sizes 1
        scale = dataclasses.replace(scale, model=model, plan=dataclasses.replace(
            scale.plan, train=TrainParallel(1, 1, 1, None, 1, (), None), rollout=RolloutParallel(1, 1, 1)))
    dropped = [o for o in base.overrides if _not_the_scales(split_override(o)[0], user_keys)]
    if dropped:
        keys = [split_override(o)[0] for o in dropped]
        notes.append(f"the scale {scale.name}'s algorithm, model and parallel settings are not applied to the "
                     f"recipe's job ({len(keys)}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}); verl's "
                     "defaults hold where the recipe sets none")
    kept = tuple(o for o in base.overrides if o not in dropped)
    return scale, dataclasses.replace(base, overrides=kept), dropped


def _fork_rollout(user: UserRecipe, notes: list[str]) -> list[str]:
    """cann-recipes-train's verl fork sizes the rollout from the environment: VLLM_DP_SIZE is vLLM's data parallel size
    and every engine runs with enable_expert_parallel=True, so EP = DP x TP (llm_rl/deepseek/verl_patches/workers/
    vllm_rollout/vllm_rollout_spmd.py, `LLM(..., enable_expert_parallel=True)` after `init_parallel_state` when
    VLLM_DP_SIZE > 1). verl 0.9.1 takes both as rollout overrides; without them seed 002's rollout held every expert
    on each TP2 pair (629 GiB)."""
    values = user.override_map()
    dp_env = user.env.get("VLLM_DP_SIZE")
    if dp_env is None or f"{_RO}.data_parallel_size" in values or f"{_RO}.expert_parallel_size" in values:
        return []
    dp = _int("env VLLM_DP_SIZE", dp_env, 1)
    tp = _int(f"{_RO}.tensor_model_parallel_size", values.get(f"{_RO}.tensor_model_parallel_size"), 1)
    if dp <= 1:
        return []
    out = [f"{_RO}.data_parallel_size={dp}", f"{_RO}.expert_parallel_size={dp * tp}"]
    notes.append(f"VLLM_DP_SIZE={dp_env} (cann-recipes-train's verl fork: vLLM data parallel, expert parallel always "
                 f"on) read as {out[0]} and {out[1]} (DP x TP)")
    return out


def _not_the_scales(key: str, user_keys: set[str]) -> bool:
    """A base key a launch script's job does not take from the scale."""
    if key in user_keys:
        return False
    # rollout.max_model_len: verl's null is prompt + response; the scale's 4096 cut a recipe's 2048 + 8192
    return (rehearsed(key) or key in _MODEL_KEYS or key in (OVERLONG_LEN, MAX_RESP_LEN, f"{_RO}.max_model_len")
            or key in _ENGINE_KEYS
            and key != "model_engine" or bool(_PARALLEL.fullmatch(key)) or key.startswith("reward.reward_kwargs.")
            # the scale's offloads (Scale.offload): a script's job offloads what it says, verl's default otherwise
            or key.endswith("_offload"))


def _changes(values: Mapping[str, str], origins: Mapping[str, str], scale: str) -> list[str]:
    """A warning for each value not from the recipe that changes its model, engine, algorithm or a length."""
    out = []
    for key, value in values.items():
        origin = origins.get(key)
        if origin == "recipe":
            continue
        what = ("model" if key in _MODEL_KEYS else "engine" if key in _ENGINE_KEYS else
                "lengths" if key in _LENGTH_KEYS else "algorithm" if rehearsed(key) else None)
        if what:
            out.append(f"{key}={value} comes from the {'scale ' + scale if origin == 'scale' else 'harness'}, not the "
                       f"recipe: it changes the job's {what}")
    return out


def check_world(scale: Scale, source: str | None = None) -> None:
    """A world smaller than one replica of the plan leaves no data-parallel rank (`plan --scale full-a3 --
    trainer.nnodes=1` raised ZeroDivisionError in the memory model: issue 30): one line naming the sizes, exit 2."""
    t, r, w = scale.plan.train, scale.plan.rollout, scale.devices
    need = max(t.tp * t.pp * t.cp, t.pp * t.ep * t.etp, r.tp, 1)
    if w < need:
        raise BadInput(f"{source or scale.name}: a world of {w} device(s) (trainer.nnodes {scale.nodes} x "
                       f"n_gpus_per_node {scale.devices_per_node}) is smaller than one replica of the plan ({need}: "
                       f"train TP{t.tp} x PP{t.pp} x CP{t.cp}, PP{t.pp} x EP{t.ep} x ETP{t.etp}, rollout TP{r.tp}); "
                       "raise trainer.nnodes / trainer.n_gpus_per_node or lower the parallel sizes")


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


# Bounds of a size an override may set (issue 36: pipeline_model_parallel_size=1e9 built a list of 1e9 stages, 0 and
# 10^23 raised tracebacks): the largest NPU jobs are 16k devices; 64k leaves room and keeps every list small.
MAX_DEVICES = 1 << 16
MAX_PER_NODE = 64
SIZE_KEYS = re.compile(r".*_parallel_size|trainer\.nnodes|trainer\.n_gpus_per_node")


def _bounded(values: Mapping[str, str]) -> None:
    for key, text in values.items():
        if not SIZE_KEYS.fullmatch(key) or text is None or _value(key, text) is None:
            continue
        value = _value(key, text)
        top = MAX_PER_NODE if key == "trainer.n_gpus_per_node" else MAX_DEVICES
        if type(value) is not int or not 1 <= value <= top:
            raise BadInput(f"override {key}={text}: a whole number from 1 to {top} expected")


# The range of each number a job carries that a run refuses (or silently misreads) outside it, checked where the job
# is built (issue 48: gpu_memory_utilization=-1 or 0 and max_num_seqs=0 were a memory PASS, lr=inf and
# temperature=nan a valid plan). key -> (holds, what is expected).
RANGES = {
    f"{_RO}.gpu_memory_utilization": (lambda v: 0 < v <= 1, "a fraction of the device in (0, 1] (vLLM)"),
    f"{_RO}.max_num_seqs": (lambda v: type(v) is int and v >= 1, "a whole number >= 1 (vLLM's sequences per step)"),
    f"{_RO}.max_num_batched_tokens": (lambda v: type(v) is int and v >= 1, "a whole number >= 1 (vLLM's tokens per "
                                      "step)"),
    f"{_RO}.engine_kwargs.vllm.kv_cache_memory_bytes": (lambda v: type(v) is int and v >= 1, "a whole number of "
                                                        "bytes >= 1 (vLLM's KV pool)"),
    f"{_RO}.temperature": (lambda v: v >= 0, "a sampling temperature >= 0"),
    f"{_RO}.top_p": (lambda v: 0 < v <= 1, "a probability in (0, 1]"),
    f"{_A}.optim.lr": (lambda v: v >= 0, "a learning rate >= 0"),
}


def check_numbers(values: Mapping[str, str | None]) -> None:
    """Every number of the job finite, and each key of RANGES in its range; BadInput, one line naming the override,
    otherwise."""
    import math

    for key, text in values.items():
        value = _value(key, text)
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInput(f"override {key}={str(text)[:40]}: a finite number expected")
        rule = RANGES.get(key)
        if rule is not None and value is not None:
            holds, expected = rule
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not holds(value):
                raise BadInput(f"override {key}={str(text)[:40]}: {expected} expected")


def derive_scale(scale: Scale, values: Mapping[str, str]) -> Derived:
    """`scale` with the parallel plan, batch, devices and rollout switches the overrides set (the merged map of a
    job: the scale's own overrides and the user's), what was read, and the problems met."""
    _bounded(values)
    check_numbers(values)
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
    # (a recipe's job starts from etp None: verl's null default, = TP)
    etp = etp if etp is not None else (t.etp if f"{_MG}.expert_tensor_parallel_size" not in values and t.etp is not None
                                       else tp)
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
    model_len = _int(f"{_RO}.max_model_len", values.get(f"{_RO}.max_model_len"), low=1, high=MAX_TOKENS)
    if model_len is not None and model_len < batch.max_sequence_length:
        # verl's vLLM rollout asserts max_model_len >= prompt + response at start (issue 48: it was a PASS)
        raise BadInput(f"override {_RO}.max_model_len={model_len}: below data.max_prompt_length + "
                       f"data.max_response_length ({batch.max_prompt_length} + {batch.max_response_length}); verl's "
                       "rollout refuses it")
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
    check_numbers(values)
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


# ---------------------------------------------------------------------------------------------------- reduced layers

# The steps of the reduced scale's own job (harness.launch.jobs DEFAULT_STEPS_VERL; this layer cannot import it): the
# 64-card script's 200 steps at a reduced step of ~465 s predicted would take a day on the node.
REDUCED_STEPS = 20


def _fit(size: int, room: int, divides: int | None = None) -> int:
    """The largest size <= `size` that divides `room` (a node's devices; Megatron and vLLM split it evenly) and, when
    given, `divides` (the layers a pipeline splits)."""
    return max(d for d in range(1, max(1, min(size, room)) + 1)
               if room % d == 0 and (divides is None or divides % d == 0))


def reduce(scale: Scale, user: UserRecipe, *, model_path: str | None = None, data_dir: str | None = None) -> Job:
    """The user's recipe brought up at the reduced scale (issue 45; seed 001 brought its job up at reduced layers
    first): its own overrides -- algorithm, batch share, lengths, offloads, memory knobs -- on the reduced scale's model
    (deepseek-v3-4l: 3 dense + 1 MoE layer, DeepSeek-V3's dims) and one node of the reduced scale's hardware, the
    parallel plan cut to fit that node (each size the largest that divides the node's devices, PP the layers too),
    the prompts per step the reduced scale's (its samples per prompt stay the recipe's). Every change is a
    Change, printed by `run` / the plugin and in `plan`'s notes. BadInput when the recipe's model is not DeepSeek-V3's
    dims (the reduced model would describe another one)."""
    written = _build(scale, user, model_path=None, data_dir=data_dir)  # the recipe's job as written
    values, w, model = written.values, written.scale, scale.model
    if written.scale.model.num_hidden_layers != model.num_hidden_layers:
        dims = ("hidden_size", "num_attention_heads", "n_routed_experts", "moe_intermediate_size", "kv_lora_rank")
        other = [f"{d} {getattr(w.model, d)}" for d in dims if getattr(w.model, d) != getattr(model, d)]
        if other:
            raise BadInput(f"--recipe {user.source}: its model {w.model.name} is not DeepSeek-V3's dims "
                           f"({', '.join(other)}); the reduced tier's model is {model.name}: run the recipe at its "
                           "own tier")
    node, layers = scale.devices_per_node, model.num_hidden_layers
    t, r = w.plan.train, w.plan.rollout
    tp = _fit(t.tp, node)
    cp = _fit(t.cp, node // tp)
    pp = _fit(t.pp, node // (tp * cp), layers)
    etp = None if t.etp is None else _fit(t.etp, node // pp)
    ep = _fit(t.ep, node // (pp * (etp or tp)), model.n_routed_experts)
    rtp = _fit(r.tp, node)
    rdp = _fit(r.dp, node // rtp)
    rep = _fit(r.ep, rtp * rdp)
    dp = node // (tp * pp * cp)
    one_node = f"one {scale.hardware.name} node of {node} devices"
    # key -> (what the recipe's job runs with, its value on the node, why)
    target = {
        "trainer.nnodes": (w.nodes, 1, f"the reduced tier runs on {one_node}"),
        "trainer.n_gpus_per_node": (w.devices_per_node, node, f"the reduced tier runs on {one_node}"),
        f"{_MG}.tensor_model_parallel_size": (t.tp, tp, f"fits {one_node}"),
        f"{_MG}.context_parallel_size": (t.cp, cp, f"fits {one_node} beside TP{tp}"),
        f"{_MG}.pipeline_model_parallel_size": (t.pp, pp, f"splits the {layers} layers within {one_node}"),
        f"{_MG}.expert_tensor_parallel_size": (t.etp, etp, f"fits {one_node} with PP{pp}"),
        f"{_MG}.expert_model_parallel_size": (t.ep, ep, f"PP{pp} x EP x ETP{etp} within {one_node}"),
        f"{_RO}.tensor_model_parallel_size": (r.tp, rtp, f"a rollout instance within {one_node}"),
        f"{_RO}.data_parallel_size": (r.dp, rdp, f"rollout TP{rtp} x DP within {one_node}"),
        f"{_RO}.expert_parallel_size": (r.ep, rep, f"at most rollout TP{rtp} x DP{rdp}"),
    }
    # a step of the recipe's own batch on one node took the 64-card script 2 h (7412 s predicted): the reduced tier
    # takes the reduced scale's prompts per step; what a device holds follows the micro batch and lengths, kept
    gbs = min(w.batch.gbs, max(dp, scale.batch.gbs // dp * dp))
    target["data.train_batch_size"] = (w.batch.gbs, gbs, "the reduced scale's prompts per step: a step in minutes "
                                                          "on one node; the micro batch and lengths stay the recipe's")
    target[f"{_A}.ppo_mini_batch_size"] = (w.batch.mini_batch, min(w.batch.mini_batch, gbs),
                                           "at most the prompts per step")
    steps = _int("trainer.total_training_steps", values.get("trainer.total_training_steps"))
    if steps is not None and steps > REDUCED_STEPS:
        target["trainer.total_training_steps"] = (steps, REDUCED_STEPS, "the reduced scale's own job's steps: a "
                                                  "bring-up judged on its first curves, not the recipe's whole run")
    if t.recompute is not None and t.recompute.num_layers > layers // pp:
        key = next((k for k in (*LEGACY_KEYS, RECOMPUTE["num_layers"]) if LEGACY_KEYS.get(k, RECOMPUTE["num_layers"])
                    == RECOMPUTE["num_layers"] and k in values), RECOMPUTE["num_layers"])
        target[key] = (t.recompute.num_layers, layers // pp, f"the layers of a stage: {layers} over PP{pp}")
    changes, overrides = [], []
    for key, (before, after, why) in target.items():
        if before == after:
            continue
        changes.append(Change(key, values.get(key, f"{before} (default)"), str(after), why))
        overrides.append(f"{key}={after}")  # each a key of verl's schema (trainer/config/ppo_megatron_trainer.yaml)
    for key in (FIRST_STAGE, LAST_STAGE, FORK_STAGE_LIST):
        if key in values:
            changes.append(Change(key, values[key], None, f"the {layers} layers split evenly over PP{pp}"))
            overrides.append(f"~{key}")
    # the reduced checkpoint beside the recipe's model on the storage its nodes mount (a launched job's working
    # directory has no models/: harness.launch.jobs.shared_inputs), else the scale's own models/<name>
    written_path = values.get("actor_rollout_ref.model.path") or ""
    reduced_path = model_path or (str(Path(written_path).parent / model.name) if Path(written_path).is_absolute()
                                  and "${" not in written_path else
                                  recipes.dapo_recipe(scale).override_map()["actor_rollout_ref.model.path"])
    changes.insert(0, Change("actor_rollout_ref.model.path", values.get("actor_rollout_ref.model.path"), reduced_path,
                             f"the reduced scale's model {model.name}: {model.num_dense_layers} dense + "
                             f"{model.num_moe_layers} MoE layers of {w.model.name}'s dims"))
    reduced_user = dataclasses.replace(user, overrides=user.overrides + tuple(overrides))
    job = _build(scale, reduced_user, model_path=reduced_path, data_dir=data_dir)
    return dataclasses.replace(job, user=user, notes=(*job.notes, *(c.line() for c in changes)),
                               reduction=tuple(changes))
