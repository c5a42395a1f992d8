"""DAPO recipe for a scale: the Hydra overrides and environment of verl's Megatron trainer, and their
validation against verl's own shipped config.

verl 0.9.1 ships no `recipe.dapo` package (the DAPO recipe moved out of the wheel); its V1 trainer
(`verl.trainer.main_ppo`, `trainer.use_v1=true` by default) runs DAPO itself: dynamic sampling is
`algorithm.filter_groups` (the V1 ReplayBuffer), the overlong penalty is the `dapo` reward manager
reading `reward.reward_kwargs`. The Megatron engine is the `model_engine=megatron` config group, which
is what the deprecated `ppo_megatron_trainer.yaml` wraps, so the same override list composes in
`ppo_trainer` here and runs as `python3 -m verl.trainer.main_ppo <overrides>` on the cluster.

`validate_recipe` composes the overrides with Hydra in the installed `verl/trainer/config` and runs
verl's own `validate_config` (which converts the actor config with `omega_conf_to_dataclass`) plus
the dataclass conversion of the rollout and algorithm sections, so a misspelled key or a value verl
rejects fails here with that key named, not 40 minutes into a 256-card job.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.config.hardware import DETERMINISTIC_ENV, module_exists
from harness.config.plans import TrainParallel
from harness.config.scales import Scale
from harness.errors import BadInput, RecipeError

VERL_VERSION = "0.9.1"  # the CPU tier's verl (requirements/cpu.txt), which the built-in recipes were written for
ENTRYPOINT = "verl.trainer.main_ppo"
CONFIG_NAME = "ppo_trainer"

# DAPO (arXiv:2503.14476) clip-higher: the upper clip bound is raised so low-probability tokens can
# grow (entropy collapse otherwise); the lower bound keeps PPO's 0.2.
CLIP_RATIO_LOW = 0.2
CLIP_RATIO_HIGH = 0.28
# Dual-clip bound for negative advantages as in verl's DAPO scripts (verl's default 3.0 clips harder).
CLIP_RATIO_C = 10.0
OVERLONG_PENALTY_FACTOR = 1.0
# HCCL_BUFFSIZE (MB per communicator, CANN default 200): seed 001 measured 6-8 GB of HCCL memory per
# device that never returns to zero between phases; vLLM's MoE dispatch/combine over a 64-128 device EP
# group needs more than the default, so this is the one knob trading the two. Tune it with the memory suite.
HCCL_BUFFSIZE_MB = 512
NPU_GPU_MEMORY_UTILIZATION = 0.8  # vLLM's share of an NPU in the scales' jobs (seed 002's recipe; dapo_recipe)


@dataclass(frozen=True)
class Recipe:
    """How to launch a scale's DAPO job with verl: `env python3 -m entrypoint overrides...`."""

    scale: str
    entrypoint: str
    overrides: tuple[str, ...]  # Hydra override strings, in the order they are applied
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(self, python: str = "python3") -> list[str]:
        return [python, "-m", self.entrypoint, *self.overrides]

    def command_line(self, python: str = "python3") -> str:
        """A shell command line: env assignments, `python3 -m entrypoint`, one override per continued line."""
        head = " ".join(shell_word(w) for w in self.argv(python)[:3])
        env = [f"{k}={shell_word(v)}" for k, v in self.env.items()]
        words = [*env, head, *(shell_word(o) for o in self.overrides)]
        return " \\\n    ".join(words)

    def override_map(self) -> dict[str, str]:
        """Override key (without a leading `+`) -> value string."""
        return dict(_split_override(o) for o in self.overrides if not o.startswith("~"))

    def with_overrides(self, overrides, env: Mapping[str, str] | None = None) -> Recipe:
        """This recipe with `overrides` applied the way a later override on verl's command line wins: one of a key
        this recipe sets replaces it in place (keeping this recipe's `+` form, which is the one that composes in
        verl's schema), `~key` removes it, the rest are appended. `env` is merged over this recipe's."""
        out = list(self.overrides)
        for override in overrides:
            key = override.lstrip("+~").partition("=")[0]
            at = next((i for i, o in enumerate(out) if o.lstrip("+~").partition("=")[0] == key), None)
            if override.startswith("~"):
                if at is not None:
                    del out[at]
                else:
                    out.append(override)
            elif at is not None:
                prefix = out[at][:len(out[at]) - len(out[at].lstrip("+"))]
                out[at] = prefix + override.lstrip("+")
            else:
                out.append(override)
        return dataclasses.replace(self, overrides=tuple(out), env={**self.env, **(env or {})})


# verl's top-level config sections: `${data.x}` is an OmegaConf interpolation, `${HOME}` a shell variable (a launch
# script's reference the shell that runs the job expands: harness.config.shell leaves unset ones as written).
CONFIG_SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "reward", "algorithm", "trainer",
                   "ray_kwargs", "global_profiler", "transfer_queue", "custom_reward_function", "model_engine",
                   "hydra", "oc")
_SHELL_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def shell_refs(text: str) -> list[str]:
    """The shell variables `${NAME}` in a word (not OmegaConf interpolations of verl's config, which have dots)."""
    return [m[1] for m in _SHELL_REF.finditer(text) if m[1] not in CONFIG_SECTIONS]


def shell_word(word: str) -> str:
    """`word` quoted for a POSIX shell; a shell variable reference `${HOME}` stays expandable (double quotes), so the
    job's shell fills it in and Hydra never sees it as an interpolation (a single-quoted '${HOME}/x' reached OmegaConf,
    which failed on it: issue 30)."""
    if not shell_refs(word):
        return shlex.quote(word)
    out, at = [], 0
    for m in _SHELL_REF.finditer(word):
        if m[1] in CONFIG_SECTIONS:
            continue
        out.append(_double_quoted(word[at:m.start()]) + m[0])
        at = m.end()
    out.append(_double_quoted(word[at:]))
    return '"' + "".join(out) + '"'


def _double_quoted(text: str) -> str:
    """`text` inside double quotes, every character literal (`$`, backquote, `"`, backslash escaped)."""
    return re.sub(r'([$`"\\])', r"\\\1", text)


def _split_override(override: str) -> tuple[str, str]:
    key, sep, value = override.partition("=")
    if not sep:
        raise RecipeError(f"override {override!r} is not key=value", key=override)
    return key.lstrip("+~"), value


def _hydra_str(value: str) -> str:
    """Quote a string for Hydra's override grammar (`|`, `*`, `,` are otherwise syntax)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _hydra_value(value: str) -> str:
    """A path or name as a Hydra override value: quoted only when it holds characters Hydra parses."""
    return value if re.fullmatch(r"[\w./-]+", value) else _hydra_str(value)


def stage_overrides(train: TrainParallel) -> list[str]:
    """Per-stage layer counts as Megatron TransformerConfig fields passed through verl's
    `override_transformer_config` (mbridge builds the TransformerConfig from it):

    - uniform stages: nothing (Megatron splits num_layers / pp);
    - uneven first/last with a uniform middle (A2: 3, 4 x 14, 2; A3: 6, 8 x 6, 7):
      `num_layers_in_{first,last}_pipeline_stage`, which megatron-core core_r0.12.1 has
      (transformer_config.py) and verl reads (verl 0.9.1 verl/utils/megatron_utils.py
      get_transformer_layer_offset). core_r0.12.1 has no `pipeline_model_parallel_layout`, so
      `validate_plan` refuses any other split (rule stage-layers-expressible).
    """
    layers = train.stage_layers
    if not layers or len(set(layers)) == 1:
        return []
    prefix = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    if len(layers) == 2:
        # pp=2: there is no middle; the first-stage count alone fixes the split (the last takes the rest).
        return [f"{prefix}.num_layers_in_first_pipeline_stage={layers[0]}"]
    return [f"{prefix}.num_layers_in_first_pipeline_stage={layers[0]}",
            f"{prefix}.num_layers_in_last_pipeline_stage={layers[-1]}"]


def recompute_overrides(train: TrainParallel) -> list[str]:
    """The plan's activation recompute, always explicit (verl's megatron engine defaults it to null, so a recipe
    that says nothing runs without recompute while a memory model may assume it). Keys of verl 0.9.1
    trainer/config/engine/megatron.yaml `override_transformer_config`; values as megatron-core
    TransformerConfig takes them."""
    prefix = "actor_rollout_ref.actor.megatron.override_transformer_config"
    rc = train.recompute
    if rc is None:
        return [f"{prefix}.recompute_granularity=null", f"{prefix}.recompute_method=null",
                f"{prefix}.recompute_num_layers=null"]
    return [f"{prefix}.recompute_granularity=full", f"{prefix}.recompute_method={rc.method}",
            f"{prefix}.recompute_num_layers={rc.num_layers}"]


def npu_training_overrides() -> list[str]:
    """What the Megatron engine needs on Ascend (MindSpeed on megatron-core core_r0.12.1):

    - `use_flash_attn=True`: MindSpeed's fused attention (torch_npu.npu_fusion_attention), as verl's Ascend quick
      start (docs/ascend_tutorial/ascend_quick_start.rst) and the r1_ascend DeepSeek-V3 671B recipe
      (recipe/r1_ascend/run_deepseekv3_671b_grpo_megatron_npu.sh) set it; verl 0.9.1's MindSpeed engine
      (verl/workers/engine/mindspeed/transformer_impl.py `_mindspeed_repatch`) would default it on too, explicit
      here so the plan says what runs. It is the path of seed 001's softmax-scale bug (MindSpeed
      v2.2.0_core_r0.12.1 flash_attention/adaptor.py), so suites/precision/test_training_softmax_scale.py probes it.
    - `vanilla_mbridge=True`: verl 0.9.1 defaults to Megatron-Bridge (verl/workers/engine/megatron/
      transformer_impl.py `_build_tf_config`), whose releases need megatron-core >= 0.15 and transformers < 5
      (megatron-bridge 0.3.1 metadata): neither fits MindSpeed's core_r0.12.1 nor verl's transformers >= 5.5.3.
    """
    return ["+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=True",
            "actor_rollout_ref.actor.megatron.vanilla_mbridge=True"]


def recipe_env(scale: Scale) -> dict[str, str]:
    """Environment of the verl job for a scale. Only NPU scales need any.

    No PYTORCH_NPU_ALLOC_CONF=expandable_segments:True: vllm-ascend's sleep-mode allocator, which verl's rollout
    uses, asserts it is off (vllm-ascend v0.23.0 vllm_ascend/device_allocator/camem.py `CaMemAllocator.__init__`;
    vllm_ascend/platform.py sets it only when sleep mode is off: "We should not set this ... in RL")."""
    if scale.hardware.kind != "npu":
        return {}
    env = {"HCCL_BUFFSIZE": str(HCCL_BUFFSIZE_MB)}
    if scale.nodes > 1:
        # HCCL's default 120 s link set-up timeout is too short for 16-32 nodes connecting at once.
        env["HCCL_CONNECT_TIMEOUT"] = "1800"
    if scale.targets.tps_per_card is None:
        # Alignment scales (no throughput target) run deterministic (seed 001 method 3, seed 003): fixed
        # seeds and deterministic HCCL/matmul, so curves can be compared with the GPU baseline. The
        # throughput scale (seed 002, 120 TPS/card) does not: deterministic reductions cost speed.
        env.update(DETERMINISTIC_ENV)
    return env


def path_overrides(*, model_path: str | None = None, data_dir: str | None = None) -> list[str]:
    """The overrides of `--model-path` / `--data-dir` (only those given): the HF model directory, and the directory
    holding train.parquet and test.parquet."""
    out = [f"actor_rollout_ref.model.path={_hydra_value(model_path)}"] if model_path else []
    if data_dir:
        data_dir = data_dir.rstrip("/")
        out += [f"data.train_files={_hydra_value(data_dir + '/train.parquet')}",
                f"data.val_files={_hydra_value(data_dir + '/test.parquet')}"]
    return out


def dapo_recipe(scale: Scale, *, model_path: str | None = None, data_dir: str | None = None) -> Recipe:
    """The DAPO job of a scale as verl Hydra overrides plus environment.

    `model_path` is the HF model directory (default `models/<model name>`), `data_dir` holds
    `train.parquet` and `test.parquet` (default `data/dapo`); both are only written into the overrides.
    """
    t, r, b = scale.plan.train, scale.plan.rollout, scale.batch
    model_path = model_path or f"models/{scale.model.name}"
    data_dir = (data_dir or "data/dapo").rstrip("/")
    overlong = b.overlong_buffer
    device = {"npu": "npu", "gpu": "cuda"}.get(scale.hardware.kind, "cpu")
    a, ro, mg = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.megatron"
    overrides = [
        "model_engine=megatron",  # the Megatron (mbridge / MindSpeed on NPU) engine group
        # --- algorithm: DAPO = GRPO advantages, no KL, clip-higher, token-mean loss, dynamic sampling
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"{a}.use_kl_loss=False",
        f"{a}.kl_loss_coef=0.0",
        f"{a}.clip_ratio_low={CLIP_RATIO_LOW}",
        f"{a}.clip_ratio_high={CLIP_RATIO_HIGH}",
        f"{a}.clip_ratio_c={CLIP_RATIO_C}",
        f"{a}.loss_agg_mode=token-mean",  # DAPO token-level loss: long responses are not down-weighted
        f"{a}.entropy_coeff=0",
        # Dynamic sampling: drop groups whose samples all score the same `acc` (zero advantage).
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        # Overlong reward shaping: the dapo reward manager reads reward.reward_kwargs (not in the
        # shipped schema, hence `+`; verl never converts `reward` to a dataclass, so it is accepted).
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        f"+reward.reward_kwargs.overlong_buffer_cfg.len={overlong}",
        f"+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor={OVERLONG_PENALTY_FACTOR}",
        "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
        f"+reward.reward_kwargs.max_resp_len={b.max_response_length}",
        # --- data and batch
        f"data.train_files={_hydra_value(data_dir + '/train.parquet')}",
        f"data.val_files={_hydra_value(data_dir + '/test.parquet')}",
        f"data.train_batch_size={b.gbs}",
        f"data.max_prompt_length={b.max_prompt_length}",
        f"data.max_response_length={b.max_response_length}",
        f"{a}.ppo_mini_batch_size={b.mini_batch}",
        f"{a}.ppo_micro_batch_size_per_gpu={b.micro_batch_size_per_device}",
        f"{ro}.log_prob_micro_batch_size_per_gpu={b.micro_batch_size_per_device}",
        # The reference policy (on when a recipe sets use_kl_loss or use_kl_in_reward) has its own micro batch;
        # verl's validate_config refuses a recipe that turns it on without one.
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={b.micro_batch_size_per_device}",
        # The critic (on when a recipe's advantage estimator is gae) likewise, and it loads the policy's model.
        f"critic.ppo_micro_batch_size_per_gpu={b.micro_batch_size_per_device}",
        f"{ro}.n={b.n}",
        # --- model and Megatron training parallelism
        f"actor_rollout_ref.model.path={_hydra_value(model_path)}",
        # a critic's value model is the policy's model unless a recipe says otherwise (an interpolation: it follows
        # any later actor_rollout_ref.model.path)
        "critic.model.path=${actor_rollout_ref.model.path}",
        f"{mg}.tensor_model_parallel_size={t.tp}",
        f"{mg}.pipeline_model_parallel_size={t.pp}",
        f"{mg}.expert_model_parallel_size={t.ep}",
        f"{mg}.expert_tensor_parallel_size={t.etp}",
        f"{mg}.context_parallel_size={t.cp}",
        # seed 001: online HF<->MCore conversion with mbridge (as the GPU baseline) instead of offline
        # dist checkpoints; the dist path's reward rose slower in the ablation.
        f"{mg}.use_mbridge=True",
        f"{mg}.use_dist_checkpointing=False",
        *stage_overrides(t),
        *recompute_overrides(t),
        # the offloads the scale's plan is sized for, in the job itself (Scale.offload): what memory judges is what
        # runs (verl 0.9.1 trainer/config/engine/megatron.yaml defaults both to False)
        *([f"{mg}.param_offload=True", f"{mg}.optimizer_offload=True"] if scale.offload else []),
        *(npu_training_overrides() if scale.hardware.kind == "npu" else []),
        # --- rollout: vLLM (vllm-ascend on NPU)
        f"{ro}.name=vllm",
        f"{ro}.tensor_model_parallel_size={r.tp}",
        f"{ro}.data_parallel_size={r.dp}",
        f"{ro}.expert_parallel_size={r.ep}",
        # seed 001/002: graph mode (aclgraph) is what brings A3 to 120 TPS/card; eager is 2-3x slower.
        f"{ro}.enforce_eager={not scale.graph_mode}",
        # seed 001: vanilla MLA prefill broadcasts the [b,1,1,s] mask to [b,h,s,s] and OOMs at GBS 128;
        # chunked prefill takes the fused MLA path.
        f"{ro}.enable_chunked_prefill={scale.chunked_prefill}",
        # Rollout weights come from the actor by weight sync; with `dummy` a stale W_UV/W_UK_T (seed 001
        # 精度问题1, verl PR #4130) shows as gibberish, which the MLA suites catch.
        f"{ro}.load_format={scale.load_format}",
        f"{ro}.max_model_len={b.max_sequence_length}",
        # vLLM's share of the device, in the job (the memory model reads the job's, else verl's default 0.5, which
        # leaves the 671B rollout no KV pool on 64 GB: vLLM would not start): seed 002's recipe runs 0.8
        # (tests/recipes/seed002_a3_grpo.sh)
        *([f"{ro}.gpu_memory_utilization={NPU_GPU_MEMORY_UTILIZATION}"] if scale.hardware.kind == "npu" else []),
        # --- trainer
        f"trainer.device={device}",
        f"trainer.nnodes={scale.nodes}",
        f"trainer.n_gpus_per_node={scale.devices_per_node}",
        # FileLogger's JSONL ($VERL_FILE_LOGGER_PATH) is what harness.metrics ingests.
        "trainer.logger=[console,file]",
        "trainer.project_name=ascend-rl-harness",
        f"trainer.experiment_name=dapo-{scale.name}",
    ]
    recipe = Recipe(scale=scale.name, entrypoint=ENTRYPOINT, overrides=tuple(overrides), env=recipe_env(scale))
    if scale.hardware.kind == "cpu":
        from harness.config.cpu_tier import cpu_recipe

        return cpu_recipe(recipe)  # the CPU tier's differences, all named in harness.config.cpu_tier
    return recipe


def plan_document(scale: Scale, *, model_path: str | None = None, data_dir: str | None = None,
                  recipe: Recipe | None = None) -> dict:
    """JSON-ready description of a scale (what `plan --json` prints and a report embeds): model values, plan,
    DAPO overrides and environment (`recipe`'s when given: a job's, harness.config.job)."""
    recipe = recipe or dapo_recipe(scale, model_path=model_path, data_dir=data_dir)
    return {
        "scale": scale.name,
        "tier": scale.tier,
        "description": scale.description,
        "model": dataclasses.asdict(scale.model),
        "params": {"total": scale.model.total_params(), "active": scale.model.total_params(active=True)},
        "hardware": dataclasses.asdict(scale.hardware),
        "devices": scale.devices,
        "cards": scale.cards,
        "nodes": scale.nodes,
        "plan": dataclasses.asdict(scale.plan),
        "batch": scale.batch.resolved(),
        "targets": dataclasses.asdict(scale.targets),
        "verl_version": verl_release(),
        "entrypoint": recipe.entrypoint,
        "overrides": list(recipe.overrides),
        "env": dict(recipe.env),
        # the recipe leaves verl's rollout routing replay off: it cannot work on the supported stacks (stacks.py)
        "router_replay": {"mode": "disabled", "blocked_on": r3_blocked_stacks()} if scale.model.num_moe_layers
        else None,
    }


def r3_blocked_stacks() -> dict[str, list[str]]:
    """Supported NPU stack -> why verl's R3 router replay cannot work there (harness.config.stacks.r3_blockers)."""
    from harness.config.stacks import STACKS, r3_blockers

    return {s.name: r3_blockers({p.name: p.version for p in s.pins}) for s in STACKS if s.kind == "npu" and
            s.supported}


# ----------------------------------------------------------------------------------------------------
# validation against the installed verl


def installed_verl(missing_ok: bool = False) -> str | None:
    """The installed verl's version; a one-line BadInput when verl is missing (None with `missing_ok`). Any release
    is taken: a recipe is judged by composing it in the installed verl's own config (`compose`, `check_keys`, verl's
    `validate_config`), which names each key that release lacks. The version pin this replaced refused a team's
    image of verl 0.9.0 whose config takes the recipe (issue 45), and named no key where a release really differs."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        if missing_ok:
            return None
        raise BadInput(f"verl is not installed; the harness's tier runs verl {VERL_VERSION}: "
                       f"pip install --no-deps verl=={VERL_VERSION} (see requirements/cpu.txt)") from None


def verl_release() -> str:
    """The verl a job's documents and messages name: the installed one, else the release the built-in recipes were
    written for (`plan` answers without verl installed)."""
    return installed_verl(missing_ok=True) or VERL_VERSION


def _verl_config_dir() -> str:
    # the shipped YAMLs by the distribution's file list first: find_spec imports verl's packages (20-45 s here)
    with_metadata = _installed_config_dir()
    if with_metadata is not None:
        return str(with_metadata)
    spec = importlib.util.find_spec("verl.trainer.config")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"verl.trainer.config not found in the installed verl {installed_verl()}; reinstall it "
                       f"(the CPU tier's: pip install --no-deps verl=={VERL_VERSION})")
    return list(spec.submodule_search_locations)[0]


def _installed_config_dir() -> Path | None:
    try:
        root = Path(str(importlib.metadata.distribution("verl").locate_file("verl/trainer/config")))
    except importlib.metadata.PackageNotFoundError:
        return None
    return root if root.is_dir() else None


@functools.lru_cache(maxsize=4)
def verl_defaults(engine: str = "megatron") -> dict[str, object]:
    """Every leaf of the installed verl's shipped config for a `model_engine` choice, dotted key -> default, as
    `compose` builds it (the same Hydra composition `--validate` runs). A verdict about a job reads the value the job
    leaves to verl here, never a default of its own (issue 44: MemoryOptions assumed param/grad/optimizer offload that
    verl 0.9.1's trainer/config/engine/megatron.yaml defaults to False, and `memory --scale full-a3` said PASS at
    54 GiB for a job that needs ~114 GiB). Cached on disk per installed verl and its YAMLs (`_schema_stamp`): a
    composition costs ~1-3 s, a `memory` answer 0.3 s."""
    import json

    from harness.io import cache_root, write_atomic

    installed_verl()
    mark = cache_root() / "verl-defaults" / f"{_schema_stamp()}-{engine}-2.json"  # -2: empty sections kept
    try:
        return json.loads(mark.read_text())
    except (OSError, ValueError):
        pass
    from omegaconf import OmegaConf

    flat: dict[str, object] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:  # a leaf: a scalar, a list (trainer.logger) or an empty section (engine_kwargs)
            flat[prefix] = node

    walk("", OmegaConf.to_container(_shipped_defaults(engine), resolve=False))
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(mark, json.dumps(flat))
    except (OSError, BadInput):  # an unwritable cache only costs the next run the composition
        pass
    return flat


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # Hydra instantiation errors wrap the real cause as "Error in call to target ...:\nCause(...)".
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = [ln for ln in lines if not ln.startswith(("Error in call to target", "full_key:", "To append"))]
    return (cause or lines)[0]


def _override_for(recipe: Recipe, message: str, section: str = "") -> str | None:
    """The override a verl/Hydra error message is about: its full key quoted or named in the message,
    else (dataclass errors name only the field) the override under `section` whose last key component
    appears first in the message."""
    keys = sorted(recipe.override_map(), key=len, reverse=True)
    quoted = set(re.findall(r"'([^']+)'", message))
    for key in keys:
        if key in quoted or re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message):
            return key
    hits = []
    for key in keys:
        if section and not key.startswith(section + "."):
            continue
        found = re.search(rf"(?<!\w){re.escape(key.rsplit('.', 1)[-1])}(?!\w)", message)
        if found:
            hits.append((found.start(), key))
    return min(hits)[1] if hits else None


def compose(recipe: Recipe):
    """verl's shipped `ppo_trainer` config with the recipe's overrides applied (an OmegaConf DictConfig).

    Composition alone (no resolution, no conversion) is what Hydra does before `main_ppo` starts.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
            return hydra_compose(config_name=CONFIG_NAME, overrides=list(recipe.overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        message = _first_line(exc)
        key = _override_for(recipe, str(exc))
        where = f"override {key!r}" if key else f"recipe {recipe.scale}"
        raise RecipeError(f"{where} rejected by verl {installed_verl()}'s {CONFIG_NAME} config: {message}",
                          key=key) from None


def _schema_stamp() -> str:
    """The installed verl's version and its shipped config files (name, size, mtime), read without importing verl
    (importing it to find the directory took 20-45 s on this 2-core host)."""
    import hashlib

    dist = importlib.metadata.distribution("verl")
    root = dist.locate_file("verl/trainer/config")
    digest = hashlib.sha256(dist.version.encode())
    for path in sorted(root.rglob("*.yaml")) if root.is_dir() else ():
        st = path.stat()
        digest.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def _validation_cache() -> Path:
    from harness.io import cache_root

    return cache_root() / "validated"


def check_recipe(recipe: Recipe) -> bool:
    """validate_recipe for the CLI, remembered on disk: a recipe verl's installed config already accepted (same verl,
    same shipped YAMLs, same entrypoint and overrides) is not composed again, so a second `--validate` or `launch`
    takes a second instead of verl's 20-45 s import. Only an accepted recipe is remembered: a rejected one is checked
    (and named) every time. True when the answer came from the cache."""
    import hashlib
    import json

    from harness.io import write_atomic

    installed_verl()
    key = hashlib.sha256(json.dumps([_schema_stamp(), recipe.entrypoint, list(recipe.overrides)]).encode()).hexdigest()
    mark = _validation_cache() / key
    if mark.is_file():
        return True
    validate_recipe(recipe)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(mark, f"accepted by verl {installed_verl()}\n")
    except (OSError, BadInput):  # an unwritable cache only costs the next run the composition
        pass
    return False


def validate_recipe(recipe: Recipe):
    """Compose the recipe in verl's shipped config and run verl's own checks; return the composed config.

    Raises RecipeError (a BadInput: CLI exit 2) naming the override or config section verl rejects, and
    BadInput when the installed verl is not the pinned one or the entrypoint module is missing.
    """
    # Cached on the hashable parts (env is a dict): composition + dataclass conversion costs ~1-3 s.
    return _validated(recipe.scale, recipe.entrypoint, recipe.overrides)


@functools.lru_cache(maxsize=4)
def _shipped_defaults(engine: str = "megatron"):
    """verl's shipped config for a `model_engine` choice (megatron, or ppo_trainer's default `dp`: FSDP) without the
    recipe: the keys and types every override must keep."""
    return compose(Recipe(scale="<defaults>", entrypoint=ENTRYPOINT, overrides=(f"model_engine={engine}",)))


def _check_types(recipe: Recipe, config) -> None:
    """verl's YAML is not a structured config, so Hydra accepts `clip_ratio_high=abc` and the Python
    dataclasses do not check types either; a value must keep the type of verl's shipped default."""
    from omegaconf import OmegaConf

    defaults = _shipped_defaults()
    for key in recipe.override_map():
        default = OmegaConf.select(defaults, key, default=None, throw_on_missing=False)
        if default is None or not isinstance(default, (bool, int, float)):
            continue
        value = OmegaConf.select(config, key)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            # verl's YAML writes some float fields as whole numbers (rollout top_p: 1; workers/config/rollout.py
            # says `top_p: float = 1.0`): a float there is the field's own type
            ok = isinstance(value, int) and not isinstance(value, bool) or \
                isinstance(value, float) and _declared_float(config, key)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise RecipeError(f"recipe {recipe.scale}: override {key!r} = {value!r} rejected: verl "
                              f"{installed_verl()} expects {type(default).__name__} (default {default!r})", key=key)


def _declared_float(config, key: str) -> bool:
    """Whether verl's dataclass for the section holding `key` (the nearest enclosing node with a `_target_`)
    declares the field a float."""
    import typing

    from hydra.utils import get_class
    from omegaconf import OmegaConf

    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        node = OmegaConf.select(config, ".".join(parts[:cut]), default=None, throw_on_missing=False)
        target = node.get("_target_") if hasattr(node, "get") else None
        if not target or cut != len(parts) - 1:
            continue
        try:
            hints = typing.get_type_hints(get_class(target))
        except Exception:  # a target that is not importable here: no evidence either way
            return False
        return hints.get(parts[-1]) is float
    return False


def _check_choices(recipe: Recipe, config) -> None:
    """Names verl resolves only at run time, checked against verl's own registries now."""
    from verl.experimental.reward_loop.reward_manager import registry as reward_registry  # V1 trainer's reward loop
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    rollout = config.actor_rollout_ref.rollout
    reward_manager = config.reward.reward_manager
    checks = [
        ("algorithm.adv_estimator", config.algorithm.adv_estimator, sorted(ADV_ESTIMATOR_REGISTRY)),
        ("actor_rollout_ref.rollout.name", rollout.name,
         sorted({n for n, m in _ROLLOUT_REGISTRY if m == rollout.mode})),
    ]
    if reward_manager.source == "register":
        checks.append(("reward.reward_manager.name", reward_manager.name, sorted(reward_registry.REWARD_MANAGER)))
    for key, value, known in checks:
        if value not in known:
            raise RecipeError(f"recipe {recipe.scale}: override {key!r} = {value!r} is not known to verl "
                              f"{installed_verl()}; known: {', '.join(map(str, known))}", key=key)


_PLACEHOLDER = re.compile(r"<[^<>]*>")


def check_placeholders(recipe: Recipe) -> None:
    """Every override whose value is a placeholder such as `<path_to_dsv3_config>` (verl's examples ship them), all
    at once: no cluster is booked for a job that cannot start (issue 30)."""
    bad = [o for o in recipe.overrides if not o.startswith("~") and _PLACEHOLDER.search(o.partition("=")[2])]
    if bad:
        raise RecipeError(f"recipe {recipe.scale}: {len(bad)} override(s) hold a placeholder to fill in: "
                          + "; ".join(bad), key=_split_override(bad[0])[0])


@functools.lru_cache(maxsize=4)
def _known_keys(engine: str) -> frozenset[str]:
    """Every leaf and section key of verl's shipped config for the engine (dotted)."""
    return frozenset(k.rsplit(".", i)[0] for k in verl_defaults(engine) for i in range(k.count(".") + 1))


def dropped_keys(recipe: Recipe) -> list[str]:
    """The recipe's override keys verl's installed config does not have, each with the closest key it has: what
    `check_keys` refuses, named by the commands that judge a job without composing it (issue 44: `memory` dropped a
    misspelled key silently where `plan --validate` and `launch` named it). Read from the cached defaults: no
    composition."""
    engine = (recipe.override_map().get("model_engine") or "dp").strip("'\"")
    if engine not in ("megatron", "dp"):
        return []
    keys = [_split_override(o)[0] for o in recipe.overrides if not o.startswith(("+", "~"))]
    return _unknown_keys([k for k in keys if k != "model_engine"], _known_keys(engine))


def check_keys(recipe: Recipe) -> None:
    """Every override key verl's config does not have (Hydra stops at the first; a user fixed one per 7-20 s run),
    each with the closest key verl has. `+key` adds a key and `~key` removes one: not checked here."""
    unknown = dropped_keys(recipe)  # another engine group: Hydra's composition names its keys
    if unknown:
        raise RecipeError(f"recipe {recipe.scale}: {len(unknown)} key(s) not in verl {installed_verl()}'s config: "
                          + "; ".join(unknown), key=unknown[0].split(" ")[0])


def check_rehearsal_keys(source: str, keys: list[str], also_known: frozenset[str] = frozenset()) -> None:
    """The keys a tiny rehearsal drops (model, parallelism, hardware: the tiny scale's own) are still the job's: one
    no engine of verl's config has (nor `also_known`, the fork keys the harness translates) would fail the job
    itself, so the rehearsal refuses it too (`launch --scale tiny --local -- ...tensor_model_paralel_size=4` dropped
    the typo and ran)."""
    installed_verl()
    unknown = _unknown_keys(keys, _known_keys("dp") | _known_keys("megatron") | also_known)
    if unknown:
        raise RecipeError(f"recipe {source}: {len(unknown)} key(s) not in verl {installed_verl()}'s config (the tiny "
                          "rehearsal would drop them; the job itself fails on them): " + "; ".join(unknown),
                          key=unknown[0].split(" ")[0])


def _unknown_keys(keys: list[str], known: frozenset[str]) -> list[str]:
    """Each key not in `known`, with the closest known key (a sibling first)."""
    import difflib

    out = []
    for key in keys:
        if key in known:
            continue
        parent = key.rpartition(".")[0]
        siblings = [k for k in known if k.rpartition(".")[0] == parent] or list(known)
        close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
        out.append(f"{key}" + (f" (did you mean {close[0]}?)" if close else " (add it with +key=value if verl "
                                                                              "should take a new key)"))
    return out


def _hydra_overrides(recipe: Recipe) -> tuple[str, ...]:
    """The overrides as verl receives them after the job's shell: a `${HOME}` shell reference is text by then (given
    a stand-in value here), never an OmegaConf interpolation."""
    return tuple(_SHELL_REF.sub(lambda m: m[0] if m[1] in CONFIG_SECTIONS else f"shell-{m[1]}", o)
                 for o in recipe.overrides)


def _resolve(recipe: Recipe, config, version: str) -> None:
    """Resolve every interpolation as verl does when it converts the config: a dangling `${...}` fails here."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or _override_for(recipe, str(exc))
        raise RecipeError(f"recipe {recipe.scale}: {key or 'an interpolation'} does not resolve in verl "
                          f"{version}'s config: {_first_line(exc)}", key=key) from None


def check_user_overrides(source: str, overrides: tuple[str, ...]) -> None:
    """What `doctor --recipe` checks of a user's own overrides (no scale, so no whole job to run verl's validate_config
    on): the placeholders, the keys verl's config has, composition and interpolations -- `launch`'s checks."""
    recipe = Recipe(scale=source, entrypoint=ENTRYPOINT, overrides=tuple(overrides))
    version = installed_verl()
    check_placeholders(recipe)
    recipe = dataclasses.replace(recipe, overrides=_hydra_overrides(recipe))
    check_keys(recipe)
    _resolve(recipe, compose(recipe), version)


@functools.lru_cache(maxsize=32)
def _validated(scale: str, entrypoint: str, overrides: tuple[str, ...]):
    recipe = Recipe(scale=scale, entrypoint=entrypoint, overrides=overrides)
    version = installed_verl()
    check_placeholders(recipe)
    if not module_exists(entrypoint):
        raise BadInput(f"recipe {scale}: entrypoint module {entrypoint} is not in the installed verl")
    recipe = dataclasses.replace(recipe, overrides=_hydra_overrides(recipe))
    check_keys(recipe)
    config = compose(recipe)
    _resolve(recipe, config, version)

    import contextlib
    import io
    import warnings

    from verl.utils.config import omega_conf_to_dataclass, validate_config

    # verl.trainer.ppo.utils.need_reference_policy / need_critic, restated: importing that module pulls
    # verl's dataset stack (`datasets`), which the CPU tier does not install.
    use_ref = bool(config.algorithm.get("use_kl_in_reward", False) or config.actor_rollout_ref.actor.use_kl_loss)
    critic_enable = config.critic.get("enable")
    use_critic = bool(critic_enable) if critic_enable is not None else config.algorithm.adv_estimator == "gae"
    sections = {
        # validate_config checks across sections (batch sizes vs parallelism): no section prefix.
        "": lambda: validate_config(config, use_reference_policy=use_ref, use_critic=use_critic),
        "actor_rollout_ref.rollout": lambda: omega_conf_to_dataclass(config.actor_rollout_ref.rollout),
        "algorithm": lambda: omega_conf_to_dataclass(config.algorithm),
    }
    for section, convert in sections.items():
        try:
            # verl prints a success line and warns (sequence parallel off for TP 1, no critic for GRPO);
            # neither may reach stdout, where `plan --json` writes its document.
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                convert()
        except Exception as exc:  # verl raises AssertionError, ValueError, TypeError, InstantiationException
            full_key = re.search(r"full_key:\s*(\S+)", str(exc))
            where_section = full_key.group(1) if full_key else section
            key = _override_for(recipe, str(exc), where_section)
            where = f"override {key!r}" if key else f"section {where_section or 'verl validate_config'}"
            raise RecipeError(f"recipe {scale}: {where} rejected by verl {version}: {_first_line(exc)}",
                              key=key) from None
    _check_types(recipe, config)
    _check_choices(recipe, config)
    return config


# ---------------------------------------------------------------------------------------------------- another verl

_VERSION = re.compile(r"\d+(\.\d+){1,3}([a-z]+\d*)?(\.post\d+)?")
SCHEMA_DIR = "verl/trainer/config/"  # what a verl wheel ships of its config schema


def verl_schema_dir(version: str) -> Path:
    """verl `version`'s shipped config schema (its wheel's verl/trainer/config/**), cached under the harness cache
    on first use: `pip download --no-deps verl==VERSION`, then the schema alone is extracted and renamed into place,
    as the upgrade gate builds its overlays (a half-built copy is never read; a second builder finding it done keeps
    the first). BadInput naming --verl when the version is not one or its wheel cannot be fetched."""
    import shutil
    import subprocess
    import sys
    import tempfile
    import zipfile

    from harness.io import cache_root

    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise BadInput(f"--verl {str(version)[:40]!r}: not a verl release version (e.g. 0.7.1)")
    root = cache_root() / "verl-schema"
    done = root / version / SCHEMA_DIR
    if done.is_dir():
        return done
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                              "--disable-pip-version-check", f"verl=={version}", "-d", str(building / "wheel")],
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        wheels = sorted((building / "wheel").glob("verl-*.whl"))
        if got.returncode != 0 or not wheels:
            why = [line for line in got.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise BadInput(f"--verl {version}: cannot fetch verl=={version}'s wheel ({(why or ['no wheel'])[-1][:200]})"
                           "; check the version and the package index")
        schema = building / version
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                # the schema only, and never a path outside it (a member named ../x)
                if name.startswith(SCHEMA_DIR) and ".." not in Path(name).parts and not name.endswith("/"):
                    wheel.extract(name, schema)
        if not (schema / SCHEMA_DIR / f"{CONFIG_NAME}.yaml").is_file():
            raise BadInput(f"--verl {version}: its wheel ships no {SCHEMA_DIR}{CONFIG_NAME}.yaml")
        try:
            os.replace(schema, root / version)
        except OSError:  # another builder finished first (ENOTEMPTY): its copy is the same wheel's
            pass
    except subprocess.TimeoutExpired:
        raise BadInput(f"--verl {version}: fetching its wheel took over 600 s; check the package index") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return done


def validate_against(recipe: Recipe, version: str) -> None:
    """What verl `version` accepts of the recipe, read from its own shipped schema (verl_schema_dir): placeholders,
    every key it has (with did-you-mean), composition and interpolations. Its Python checks need that verl
    installed; the installed verl's are `check_recipe`'s. RecipeError (exit 2) naming the version."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir = verl_schema_dir(version)
    check_placeholders(recipe)
    overrides = list(_hydra_overrides(recipe))
    engine = (recipe.override_map().get("model_engine") or "dp").strip("'\"")
    name = CONFIG_NAME
    if not (config_dir / "model_engine" / f"{engine}.yaml").is_file():
        # verl before the model_engine group (0.4-0.8 for megatron): the engine is its own top-level config
        overrides = [o for o in overrides if not o.startswith("model_engine=")]
        name = "ppo_megatron_trainer" if engine == "megatron" else CONFIG_NAME

    def composed(extra: list[str]):
        try:
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                return hydra_compose(config_name=name, overrides=extra)
        except (HydraException, OmegaConfBaseException) as exc:
            key = _override_for(recipe, str(exc))
            raise RecipeError(f"{f'override {key!r}' if key else f'recipe {recipe.scale}'} rejected by verl "
                              f"{version}'s {name} config: {_first_line(exc)}", key=key) from None

    known: set[str] = set()

    def walk(prefix: str, node) -> None:
        known.add(prefix)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)

    walk("", OmegaConf.to_container(composed([]), resolve=False))
    keys = [_split_override(o)[0] for o in overrides if not o.startswith(("+", "~"))]
    unknown = _unknown_keys([k for k in keys if k != "model_engine"], frozenset(known - {""}))
    if unknown:
        raise RecipeError(f"recipe {recipe.scale}: {len(unknown)} key(s) not in verl {version}'s config: "
                          + "; ".join(unknown), key=unknown[0].split(" ")[0])
    _resolve(dataclasses.replace(recipe, overrides=tuple(overrides)), composed(overrides), version)
