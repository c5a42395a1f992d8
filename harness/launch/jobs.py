"""Which job each scale runs, as the JobSpec the launchers take (the Ray Jobs launcher harness.launch.ray_job, the
K8s manifest harness.launch.k8s): verl's own `python3 -m verl.trainer.main_ppo <overrides>` with the scale's recipe
and the user's (harness.config.job.build_job: the job `plan --format verl-cli` prints) on every scale; at `tiny` on
CPU, after a preparation step that writes the tiny model, tokenizer and data into the run directory
(harness.launch.tiny_verl, which hands over plain data and knows no launcher); and the lab as a Ray job for the
launcher's own proof. Nothing here talks to a cluster, and the launcher knows none of this.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from harness.errors import BadInput
from harness.launch import tiny_verl
from harness.launch.ray_job import JobSpec
from harness.metrics.keys import HYDRA_DIR

DEFAULT_STEPS_VERL = 20  # every scale but tiny (tiny: harness.launch.tiny_verl.DEFAULT_STEPS)
# Where a cluster job finds its inputs: $HARNESS_MODEL_DIR holds one HF directory per model (`<dir>/<model name>`),
# $HARNESS_DATA_DIR the DAPO parquet files (train.parquet, test.parquet).
MODEL_DIR_ENV, DATA_DIR_ENV = "HARNESS_MODEL_DIR", "HARNESS_DATA_DIR"


def lab_job(run_dir: str | Path, *, steps: int, seed: int = 0, python: str = "python") -> JobSpec:
    """The tiny scale: the harness's DAPO lab (real verl algorithm pieces on CPU) as a Ray job."""
    run_dir = Path(run_dir).resolve()
    return JobSpec(name="tiny", total_steps=steps, run_dir=str(run_dir),
                   entrypoint=f"{python} -m harness.lab --steps {steps} --seed {seed} "
                              f"--out {shlex.quote(str(run_dir))}")


RUN_ROOT_ENV = "HARNESS_RUN_ROOT"
# What verl 0.9.1 puts into the runtime env of its own `ray.init` from the driver's environment
# (trainer/constants_ppo.py get_ppo_ray_runtime_env: the first three always, the next five when set, the NVTX one
# with the torch profiler; trainer/main_ppo.py run_ppo: TRANSFER_QUEUE_ENABLE with the V1 trainer). Ray 2.60
# `ray.init` in a job driver merges that with the job's runtime env (ray/_private/worker.py, through
# runtime_env/runtime_env.py `_merge_runtime_env`), which refuses any env var key in both: "Failed to merge the
# Job's runtime env". A recipe exporting one (a BYO recipe with PYTHONHASHSEED, verl's determinism variables) died
# at verl's ray.init. So these travel in the entrypoint's own environment (`env K=V python3 -m verl...`), from
# where verl forwards them to every worker itself; the job's runtime env carries the rest.
VERL_RAY_INIT_ENV = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE", "PYTHONHASHSEED",
                     "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC", "NCCL_DETERMINISTIC", "NCCL_ALGO",
                     "NVTX_INJECTION64_PATH", "TRANSFER_QUEUE_ENABLE")


def split_verl_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the job's runtime env, the verl entrypoint's own env): VERL_RAY_INIT_ENV goes to the entrypoint."""
    return ({k: v for k, v in env.items() if k not in VERL_RAY_INIT_ENV},
            {k: v for k, v in env.items() if k in VERL_RAY_INIT_ENV})


def with_env(argv: tuple[str, ...], env: Mapping[str, str]) -> tuple[str, ...]:
    """`argv` run under `env K=V ...` (unchanged when `env` is empty)."""
    return ("env", *(f"{k}={v}" for k, v in env.items()), *argv) if env else tuple(argv)


def shared_run_root(env: Mapping[str, str] | None = None) -> Path:
    """The run root of a cluster run: $HARNESS_RUN_ROOT, an absolute, existing directory on storage the cluster's
    nodes and this host both mount. verl's FileLogger writes the run's metrics from the node the job runs on; a run
    directory under this host's relative `runs/` exists only here, so the harness ingested 0 steps, a whole 256-card
    night ended FAILED and --abort-on-fail never saw a step. BadInput naming the variable otherwise."""
    value = (os.environ if env is None else env).get(RUN_ROOT_ENV, "")
    if not value or not os.path.isabs(value) or not os.path.isdir(value):
        what = f"{RUN_ROOT_ENV}={value!r} is not an absolute existing directory" if value else f"{RUN_ROOT_ENV} unset"
        raise BadInput(f"a cluster address is given but {what}: set it to a directory on storage every node and this "
                       "host mount (the job writes its logs there on a cluster node; the harness reads them here)")
    return Path(value)


def shared_inputs(scale, model_path: str | None, data_dir: str | None) -> tuple[str, str]:
    """(model path, data dir) of a cluster scale, both absolute: Ray uploads the working directory without models/
    and data/ (harness.launch.ray_job.WORKING_DIR_EXCLUDES) and runs the job from a copy of it, so the recipe's
    relative defaults (`models/<name>`, `data/dapo`) resolve nowhere on the workers. Defaults from
    $HARNESS_MODEL_DIR / $HARNESS_DATA_DIR; BadInput naming what is missing otherwise."""
    model_root = os.environ.get(MODEL_DIR_ENV)
    model_path = model_path or (os.path.join(model_root, scale.model.name) if model_root else None)
    data_dir = data_dir or os.environ.get(DATA_DIR_ENV)
    bad = [f"{what} {path!r}" if path else f"no {what} (set ${env})"
           for what, path, env in (("model path", model_path, MODEL_DIR_ENV), ("data dir", data_dir, DATA_DIR_ENV))
           if not path or not os.path.isabs(path)]
    if bad:
        raise BadInput(f"scale {scale.name} runs on a cluster: {'; '.join(bad)}; give absolute paths on storage every "
                       f"node mounts (${MODEL_DIR_ENV} holding {scale.model.name}/, ${DATA_DIR_ENV} holding "
                       "train.parquet and test.parquet): the job's uploaded working directory has no models/ or data/")
    return model_path, data_dir


def verl_job(scale, run_dir: str | Path, *, steps: int, model_path: str | None = None, data_dir: str | None = None,
             extra_overrides: tuple[str, ...] = (), resume: bool = False, recipe=None,
             env: Mapping[str, str] | None = None, prelude: tuple[tuple[str, ...], ...] = ()) -> JobSpec:
    """A scale's DAPO job: verl's entrypoint with harness.config.recipe's overrides (or `recipe`'s: a job's,
    harness.config.job), writing into `run_dir`. Every scale but tiny (whose job writes its own inputs into the run
    directory) needs absolute `shared_inputs`. `env` adds to the recipe's environment; `prelude`: commands (argv)
    the job runs first, each of which must succeed before verl starts."""
    from harness.config.recipe import dapo_recipe, shell_word

    run_dir = Path(run_dir).resolve()
    if recipe is None:
        if scale.tier != "tiny":
            model_path, data_dir = shared_inputs(scale, model_path, data_dir)
        recipe = dapo_recipe(scale, model_path=model_path, data_dir=data_dir)
    # applied as verl's command line would take them, a key the recipe sets replaced in place: appended, the recipe's
    # trainer.total_training_steps=10 was followed by =20 and a second default_local_dir (issue 44)
    overrides = [*recipe.with_overrides([
                 f"trainer.total_training_steps={steps}",
                 f"trainer.default_local_dir={run_dir / 'checkpoints'}",
                 f"trainer.resume_mode={'auto' if resume else 'disable'}",
                 f"trainer.rollout_data_dir={run_dir / 'rollouts'}",  # seed 003: rollouts dumped per step
                 # verl's own resolved config (Hydra writes .hydra/config.yaml there): what the run really trained
                 # with, defaults of the installed verl included (harness.metrics.ingest reads it into the run)
                 f"hydra.run.dir={run_dir / HYDRA_DIR}",
                 f"global_profiler.save_path={run_dir / 'profiles'}",
                 *extra_overrides]).overrides]
    job_env, verl_env = split_verl_env({**recipe.env, **(env or {})})
    commands = [*prelude, with_env(("python3", "-m", recipe.entrypoint, *overrides), verl_env)]
    # shell_word: a recipe's `${HOME}` stays for the job's shell to expand (single-quoted, OmegaConf failed on it)
    entrypoint = " && ".join(" ".join(shell_word(w) for w in argv) for argv in commands)
    return JobSpec(name=scale.name, entrypoint=entrypoint, run_dir=str(run_dir), total_steps=steps,
                   env=job_env, resume=resume)


def check_steps(steps: int | None) -> int | None:
    """`--steps`: None (the scale's default) or a positive count; BadInput otherwise (-3 once went into the
    manifest and 0 silently became 20)."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise BadInput(f"--steps {steps}: must be a positive number of training steps (omit it for the default)")
    return steps


def job_for_scale(scale, run_dir: str | Path, *, steps: int | None = None, resume: bool = False, seed: int = 0,
                  fault: str | None = None, user=None, model_path: str | None = None,
                  data_dir: str | None = None) -> JobSpec:
    """The job `launch --scale NAME` submits: the scale with the user's recipe (`user`, a
    harness.config.user_recipe.UserRecipe) as harness.config.job.build_job makes it -- the job `plan --format
    verl-cli` prints for the same arguments -- (at tiny: the recipe rehearsed on CPU on the run directory's own
    inputs, with `seed` and a seeded `fault` of harness.launch.tiny_verl). PlanError when the plan breaks a rule:
    no cards are booked for it."""
    from harness.config.job import build_job
    from harness.errors import PlanError

    steps = check_steps(steps)
    if scale.tier == "tiny":
        steps = steps or tiny_verl.DEFAULT_STEPS
        options = tiny_verl.job_options(run_dir, steps=steps, seed=seed, fault=fault)
        job = build_job(scale, user, model_path=options.pop("model_path"), data_dir=options.pop("data_dir"))
        return verl_job(job.scale, run_dir, steps=steps, recipe=job.recipe, **options)
    if fault is not None:
        raise BadInput(f"--fault {fault}: rollout faults are seeded only into the tiny CPU run")
    given = user.override_map() if user else {}
    if not (os.path.isabs(given.get("actor_rollout_ref.model.path") or "")
            and os.path.isabs(given.get("data.train_files") or "")):  # the recipe names no absolute inputs itself
        model_path, data_dir = shared_inputs(scale, model_path, data_dir)
    job = build_job(scale, user, model_path=model_path, data_dir=data_dir)
    if job.plan_error:
        raise PlanError(f"{user.source if user else scale.name}: {job.plan_error}")
    return verl_job(job.scale, run_dir, steps=job_steps(job.recipe, steps), resume=resume, recipe=job.recipe)


def job_steps(recipe, steps: int | None) -> int:
    """The steps a cluster job runs: `--steps` when given, else the recipe's own trainer.total_training_steps, else
    DEFAULT_STEPS_VERL (the default was appended after a recipe's own, and Hydra's last override won: a recipe's 10
    became 20 -- issue 44)."""
    own = recipe.override_map().get("trainer.total_training_steps")
    return steps or (int(own) if own and own.strip().isdigit() and int(own) > 0 else DEFAULT_STEPS_VERL)
