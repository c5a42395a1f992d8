"""Bring your own job: a user's verl recipe (a launch script read, never run, or a Hydra YAML, plus overrides after
`--`) through plan / memory / launch, one code path (harness.config.job.build_job).

The fixture tests/recipes/seed002_a3_grpo.sh is seed 002's A3 launch script (TP4 PP8 EP8, stages 7,7,8,8,8,8,8,7,
GBS 512 x 16, 1K/3K, recompute 8 layers, KL loss): `plan --recipe` must reproduce that plan and give a memory verdict.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.config.job import build_job, derive_scale, rehearsed
from harness.config.scales import get_scale
from harness.config.user_recipe import parse_hydra_yaml, parse_launch_script, read_recipe
from harness.errors import BadInput

SEED002 = Path(__file__).parent / "recipes" / "seed002_a3_grpo.sh"
MG = "actor_rollout_ref.actor.megatron"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------------- reading

def test_launch_script_reads_as_main_ppo_would_receive_it():
    recipe = read_recipe(str(SEED002))
    values = recipe.override_map()
    assert recipe.entrypoint == "verl.trainer.main_ppo"
    assert values[f"{MG}.tensor_model_parallel_size"] == "4"  # $TP
    assert values["data.max_response_length"] == "3072"  # ${MAX_RESPONSE} = $((1024 * 3))
    assert values["data.truncation"] == "error"  # 'error': the shell's quotes are gone
    assert values["trainer.logger"] == "[console,tensorboard]"
    assert values[f"{MG}.dist_checkpointing_path"] == "/data/dsv3/sharded_tp4_pp8_ep8"  # an exported variable
    assert not any(o.startswith(("2>", "|", "tee", "$@")) for o in recipe.overrides), recipe.overrides
    assert recipe.env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert recipe.env["WORLD_SIZE"] == "256"  # $(($NNODES*$NPUS_PER_NODE))
    assert recipe.env["HCCL_SOCKET_IFNAME"] == "SOCKET IFNAME FOR CURRENT NODE"  # an assignment is not word-split
    assert "NNODES" not in recipe.env, "a variable the script does not export is not the job's environment"
    notes = " ".join(recipe.notes)
    assert "command substitution $(ifconfig" in notes and "$@" in notes, recipe.notes


def test_the_script_is_never_run(tmp_path):
    """A recipe is read: a command in it (here one that would leave a file behind) never runs."""
    mark = tmp_path / "ran"
    script = tmp_path / "job.sh"
    script.write_text(f"touch {mark}\nX=$(touch {mark}.sub)\nexport A=`touch {mark}.tick`\n"
                      "python3 -m verl.trainer.main_ppo data.train_batch_size=8\n")
    recipe = read_recipe(str(script))
    assert recipe.overrides == ("data.train_batch_size=8",)
    assert not list(tmp_path.glob("ran*")), "something in the recipe ran"


def test_shell_expansions_and_structure():
    text = "\n".join([
        "#!/bin/bash", "set -x", "# a comment with python3 -m verl.trainer.main_ppo in it",
        'LEN=${LEN:-2048}', "unset_ref=${NOT_SET}", 'EXTRA="actor_rollout_ref.rollout.n=4 data.seed=3"',
        "if true; then echo start; fi",
        "HYDRA_FULL_ERROR=1 python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \\",
        "  data.max_prompt_length=$((LEN / 2)) \\",
        '  "trainer.experiment_name=run ${LEN}" \\',
        "  $EXTRA \\",
        "  trainer.project_name=$HOME_DIR/x > out.log 2>&1 &",
    ])
    recipe = parse_launch_script(text, "t.sh")
    assert recipe.overrides == ("model_engine=megatron", "data.max_prompt_length=1024",
                                "trainer.experiment_name=run 2048", "actor_rollout_ref.rollout.n=4", "data.seed=3",
                                "trainer.project_name=${HOME_DIR}/x")
    assert recipe.env == {"HYDRA_FULL_ERROR": "1"}
    assert any("HOME_DIR is not set" in n for n in recipe.notes), recipe.notes


@pytest.mark.parametrize("text, error", [
    ("echo hi\nbash ./scripts/internal/train.sh\n", "pass that file to --recipe"),
    ("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_ppo a=2\n", "2 verl commands"),
    ("python3 -m verl.trainer.main_ppo 'data.x=1\n", "unterminated single quote"),
    ("python3 -m verl.trainer.main_ppo data.x=$((3 / 0))\n", "division by zero"),
    ("python3 -m verl.trainer.main_ppo data.x=$((__import__('os')))\n", "not bash that bash would run"),
])
def test_bad_scripts_are_one_line_errors(text, error):
    with pytest.raises(BadInput, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse_launch_script(text, "bad.sh")


def test_hydra_yaml_flattens_to_overrides():
    doc = {"defaults": ["ppo_trainer"], "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
           "actor_rollout_ref": {"actor": {"use_kl_loss": True, "ppo_micro_batch_size_per_gpu": 2,
                                           "checkpoint": {"save_contents": ["model", "optimizer"]}},
                                 "model": {"path": "/models/my dsv3", "override_config": {}}},
           "trainer": {"logger": ["console", "wandb"], "val_files": None}}
    recipe = parse_hydra_yaml(yaml.safe_dump(doc, sort_keys=False), "job.yaml")
    assert recipe.overrides == (
        "algorithm.adv_estimator=grpo", "algorithm.kl_ctrl.kl_coef=0.001", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer]",
        "actor_rollout_ref.model.path='/models/my dsv3'", "actor_rollout_ref.model.override_config={}",
        "trainer.logger=[console,wandb]", "trainer.val_files=null")
    assert any("defaults" in n for n in recipe.notes)
    with pytest.raises(BadInput, match="a mapping"):
        parse_hydra_yaml("- a\n- b\n", "list.yaml")


def test_overrides_after_dashdash_are_checked_and_win(tmp_path):
    recipe = read_recipe(str(SEED002), ["actor_rollout_ref.rollout.n=8"])
    assert recipe.override_map()["actor_rollout_ref.rollout.n"] == "8"
    with pytest.raises(BadInput, match="not a Hydra override"):
        read_recipe(None, ["trainer.logger"])
    with pytest.raises(BadInput, match="--recipe .*missing.sh: cannot read"):
        read_recipe(str(tmp_path / "missing.sh"))


# ---------------------------------------------------------------------------------------------------- plan

def test_plan_recipe_reproduces_seed002_and_gives_a_memory_verdict(capsys):
    """The done criterion: seed 002's parallel plan from its own script, a memory verdict on it, and the one rule
    megatron-core 0.12 breaks (its 7,7,8,...,7 split) as the plan's verdict (exit 1)."""
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--recipe", str(SEED002), "--json")
    doc = json.loads(out)
    train, rollout = doc["plan"]["train"], doc["plan"]["rollout"]
    assert (train["tp"], train["pp"], train["ep"], train["cp"]) == (4, 8, 8, 1)
    assert train["stage_layers"] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert train["recompute"] == {"method": "block", "num_layers": 8}
    assert rollout["tp"] == 2
    assert (doc["batch"]["gbs"], doc["batch"]["n"], doc["batch"]["max_prompt_length"],
            doc["batch"]["max_response_length"]) == (512, 16, 1024, 3072)
    assert (doc["devices"], doc["nodes"], doc["cards"]) == (256, 16, 128)
    assert doc["valid"] is False and "stage-layers-expressible" in doc["plan_error"] and code == 1
    memory = doc["memory"]
    assert isinstance(memory["fits"], bool) and len(memory["phases"]) == 5
    assert memory["fits"] == all(p["fits"] for p in memory["phases"])
    assert "HCCL_BUFFSIZE=300" in memory["modelled"]
    # the job's overrides: the fork's stage list and recompute translated to verl 0.9.1's keys
    assert f"+{MG}.override_transformer_config.num_layers_in_first_pipeline_stage=7" in doc["overrides"]
    assert f"{MG}.override_transformer_config.recompute_num_layers=8" in doc["overrides"]
    assert not any("pipeline_parallel_num_layer_list" in o or "gradient_checkpointing_kwargs" in o
                   for o in doc["overrides"])
    assert "trainer.logger=[console,tensorboard,file]" in doc["overrides"]


def test_the_recipes_settings_win_over_the_scales(capsys):
    """On another scale (A2: TP8 PP16 EP16 on 32 nodes) the plan is still the recipe's."""
    job = build_job(get_scale("full-a2-gbs128"), read_recipe(str(SEED002)))
    t = job.scale.plan.train
    assert (t.tp, t.pp, t.ep, job.scale.devices, job.scale.nodes) == (4, 8, 8, 256, 16)
    assert job.scale.batch.gbs == 512 and job.scale.batch.micro_batch_size_per_device == 1
    base = build_job(get_scale("full-a2-gbs128"))
    assert (base.scale.plan.train.tp, base.scale.nodes) == (8, 32), "no recipe: the scale's own plan"


def test_plan_takes_overrides_as_main_ppo_does(capsys):
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--json", "trainer.logger=[console,wandb]")
    doc = json.loads(out)
    assert code == 0 and doc["valid"] is True
    assert "trainer.logger=[console,wandb,file]" in doc["overrides"]
    assert "trainer.logger=[console,file]" not in doc["overrides"]
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--json", "--",
                        f"+{MG}.override_transformer_config.num_layers_in_first_pipeline_stage=5")
    doc = json.loads(out)
    assert code == 1 and "stage-layers-expressible" in doc["plan_error"]  # 5 + 7 leave 49 for 6 stages


def test_validate_names_what_the_installed_verl_rejects(capsys):
    """The seed's fork keys are not verl 0.9.1's: --validate names one, exit 2, before a card is booked."""
    code, out, err = _run(capsys, "plan", "--scale", "full-a3", "--recipe", str(SEED002), "--validate")
    assert code == 2 and out == ""
    assert any(k in err for k in ("swap_optimizer", "dist_checkpointing_path", "filter_overlong_prompts")), err


def test_verl_cli_refuses_a_plan_megatron_cannot_run(capsys):
    code, out, err = _run(capsys, "plan", "--scale", "full-a3", "--recipe", str(SEED002), "--format", "verl-cli")
    assert code == 2 and out == "" and "stage-layers-expressible" in err


def test_launch_submits_exactly_what_plan_prints(capsys, tmp_path):
    """One code path: the job launch submits starts with the command `plan --format verl-cli` prints for the same
    arguments (launch then adds only the run's steps and directories)."""
    from harness.launch.jobs import job_for_scale

    recipe = tmp_path / "job.yaml"
    recipe.write_text(yaml.safe_dump({"actor_rollout_ref": {"rollout": {"n": 8, "temperature": 0.9}},
                                      "trainer": {"logger": ["console", "wandb"]}}))
    extra = ["actor_rollout_ref.actor.kl_loss_coef=0.01"]
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--recipe", str(recipe), "--format", "verl-cli",
                        "--model-path", "/m/dsv3", "--data-dir", "/d/dapo", *extra)
    assert code == 0
    printed = shlex.split(out.replace("\\\n", " "))
    spec = job_for_scale(get_scale("full-a3"), tmp_path / "run", steps=3, user=read_recipe(str(recipe), extra),
                         model_path="/m/dsv3", data_dir="/d/dapo")
    submitted = shlex.split(spec.entrypoint)
    env = [w for w in printed if "=" in w and not w.startswith(("python", "-m")) and printed.index(w) <
           printed.index("python3")]
    command = printed[len(env):]
    assert submitted[:len(command)] == command, "launch must submit the plan's command line"
    assert submitted[len(command):][0] == "trainer.total_training_steps=3"
    assert dict(w.split("=", 1) for w in env) == dict(spec.env)
    assert "actor_rollout_ref.model.path=/m/dsv3" in command and "actor_rollout_ref.rollout.n=8" in command


def test_k8s_manifest_takes_the_same_inputs(capsys, tmp_path):
    code, out, err = _run(capsys, "launch", "--scale", "full-a3", "--k8s", "--recipe", str(SEED002), "--",
                          f"{MG}.pipeline_parallel_num_layer_list=[6,8,8,8,8,8,8,7]", "trainer.nnodes=8",
                          "trainer.n_gpus_per_node=32")
    # the fork's MindSpeed swap_optimizer is no key of verl 0.9.1: no manifest until the recipe drops it
    assert code == 2 and out == "" and f"{MG}.swap_optimizer" in err
    # dropping it drops the recipe's only optimizer offload: `plan` calls that INVALID on memory, and so does launch
    # (issue 44: it printed the manifest, exit 0); --force books it and says so on the job
    args = ("launch", "--scale", "full-a3", "--k8s", "--recipe", str(SEED002), "--",
            f"{MG}.pipeline_parallel_num_layer_list=[6,8,8,8,8,8,8,7]", "trainer.nnodes=8",
            "trainer.n_gpus_per_node=32", f"~{MG}.swap_optimizer")
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == "" and "PLAN INVALID: memory does not fit" in err
    code, out, err = _run(capsys, *args[:-5], "--force", *args[-5:])
    assert code == 0 and f"read: {SEED002}" in err  # every file the job was read from is named (issue 48)
    _rings, service, job = list(yaml.safe_load_all(out))  # MindCluster's rings-config ConfigMap first
    assert "memory does not fit" in job["metadata"]["annotations"]["ascend-rl-harness/forced"]
    head = next(t for t in job["spec"]["tasks"] if t["name"] == "head")
    command = head["template"]["spec"]["containers"][0]["command"][-1]
    assert "actor_rollout_ref.actor.kl_loss_coef=0.001" in command and "trainer.nnodes=8" in command
    assert "models/deepseek-v3" not in command and "actor_rollout_ref.model.path=./DeepSeek-V3" in command
    assert job["spec"]["minAvailable"] == 8
    env = {e["name"]: e.get("value") for e in head["template"]["spec"]["containers"][0]["env"]}
    assert env["HCCL_BUFFSIZE"] == "300"
    code, _, err = _run(capsys, "launch", "--scale", "full-a3", "--k8s", "--recipe", str(SEED002))
    assert code == 2 and "stage-layers-expressible" in err, "no manifest for a plan megatron-core cannot run"


# ---------------------------------------------------------------------------------------------------- memory

def test_memory_reads_every_memory_override_and_names_the_rest(capsys):
    def memory(*extra):
        code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--json", *extra)
        return code, json.loads(out)

    _, base = memory()
    _, less = memory("actor_rollout_ref.rollout.gpu_memory_utilization=0.5")
    kv = lambda doc: next(p for p in doc["phases"] if p["phase"] == "rollout")["components_gib"]["kv_cache"]  # noqa: E731
    assert kv(less) < kv(base), "gpu_memory_utilization must size vLLM's KV pool"
    _, ref = memory("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8")
    ref_peak = lambda doc: next(p for p in doc["phases"] if p["phase"] == "ref_log_prob")["peak_gib"]  # noqa: E731
    assert ref_peak(ref) > ref_peak(base) + 10, "the reference policy's micro batch must reach its phase"
    _, dyn = memory("actor_rollout_ref.actor.use_dynamic_bsz=True", f"{MG}.virtual_pipeline_model_parallel_size=2")
    assert dyn["not_modelled"] == ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                                   f"{MG}.virtual_pipeline_model_parallel_size=2"]
    _, cp = memory(f"{MG}.context_parallel_size=2")
    # CP splits the update's activations (its peak also gains a CP communicator's HCCL buffers, so compare the term)
    update = lambda doc: next(p for p in doc["phases"] if p["phase"] == "update")["components_gib"]  # noqa: E731
    assert update(cp)["activations"] < update(base)["activations"] and cp["not_modelled"] == []


def test_memory_recipe_models_the_seed_as_written(capsys):
    code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--recipe", str(SEED002), "--json")
    doc = json.loads(out)
    assert doc["recipe"] == str(SEED002) and "stage-layers-expressible" in doc["plan_error"]
    assert any(m.startswith(f"{MG}.swap_optimizer=True") for m in doc["modelled"])
    assert code == (0 if doc["passed"] else 1)
    update = next(p for p in doc["phases"] if p["phase"] == "update")
    assert "optimizer" not in update["components_gib"], "swap-optimizer keeps the optimizer off the device"
    # without --scale the launch script is its own job, as in `plan --recipe`: seed 002 fits as it did in production
    code, out, _ = _run(capsys, "memory", "--recipe", str(SEED002), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["scale"] == "full-a3"


# ---------------------------------------------------------------------------------------------------- rehearsal

def test_tiny_rehearsal_keeps_the_algorithm_and_scales_the_rest():
    tiny = get_scale("tiny")
    job = build_job(tiny, read_recipe(str(SEED002)))
    values = job.recipe.override_map()
    # the user's algorithm
    for key, value in (("actor_rollout_ref.actor.use_kl_loss", "True"),
                       ("actor_rollout_ref.actor.kl_loss_coef", "0.001"),
                       ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"), ("algorithm.adv_estimator", "grpo"),
                       ("actor_rollout_ref.rollout.n", "16"), ("actor_rollout_ref.rollout.temperature", "0.9"),
                       ("actor_rollout_ref.rollout.top_k", "50"), ("algorithm.kl_ctrl.kl_coef", "0.001")):
        assert values[key] == value, key
    # the tiny scale's model, lengths, batch, parallelism and tier, read from the scale (never copied)
    assert values["data.max_response_length"] == str(tiny.batch.max_response_length)
    assert values["data.max_prompt_length"] == str(tiny.batch.max_prompt_length)
    assert values["trainer.device"] == "cpu" and values["model_engine"] == "dp"
    assert values["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    assert job.scale.batch.gbs * job.scale.batch.n == tiny.batch.sequences
    assert values["data.train_batch_size"] == str(job.scale.batch.gbs)
    assert not any(k.startswith(f"{MG}.") for k in values), "no Megatron keys on the CPU tier"
    assert job.recipe.env == build_job(tiny).recipe.env
    assert any("43 override(s)" in n for n in job.notes), job.notes


def test_rehearsal_scales_the_overlong_buffer_with_the_response():
    user = read_recipe(None, ["data.max_response_length=4096", "+reward.reward_kwargs.overlong_buffer_cfg.len=1024",
                              "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5"])
    tiny = get_scale("tiny")
    values = build_job(tiny, user).recipe.override_map()
    response = tiny.batch.max_response_length
    assert values["reward.reward_kwargs.overlong_buffer_cfg.len"] == str(max(1, response // 4))  # the recipe's quarter
    assert values["reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"] == "0.5"
    assert values["reward.reward_kwargs.max_resp_len"] == str(response)


@pytest.mark.parametrize("key, kept", [
    ("algorithm.rollout_correction.rollout_is", True), ("actor_rollout_ref.actor.policy_loss.loss_mode", True),
    ("actor_rollout_ref.actor.clip_ratio_high", True), ("actor_rollout_ref.actor.loss_agg_mode", True),
    ("actor_rollout_ref.rollout.top_p", True), ("actor_rollout_ref.actor.optim.lr", False),
    (f"{MG}.tensor_model_parallel_size", False), ("data.train_batch_size", False),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", False), ("trainer.nnodes", False),
])
def test_what_a_rehearsal_keeps(key, kept):
    assert rehearsed(key) is kept


def test_derive_reads_megatron_first_last_stage_counts():
    scale = get_scale("full-a3")
    derived = derive_scale(scale, {f"{MG}.pipeline_model_parallel_size": "4",
                                   f"{MG}.override_transformer_config.num_layers_in_first_pipeline_stage": "13",
                                   f"{MG}.override_transformer_config.num_layers_in_last_pipeline_stage": "14"})
    assert derived.scale.plan.train.stage_layers == (13, 17, 17, 14) and not derived.problems


def test_the_rehearsal_composes_in_verls_schema():
    """verl's YAML writes rollout top_p as `1` though its dataclass field is a float: the recipe's 0.9 is accepted,
    while a float epoch count (an int field) is still refused."""
    from harness.config.recipe import validate_recipe
    from harness.errors import RecipeError

    job = build_job(get_scale("tiny"), read_recipe(str(SEED002)))
    validate_recipe(job.recipe)
    bad = build_job(get_scale("tiny"), read_recipe(None, ["actor_rollout_ref.actor.ppo_epochs=1.5"]))
    with pytest.raises(RecipeError, match="ppo_epochs"):
        validate_recipe(bad.recipe)


def test_seed002_fits_and_plan_agrees_with_memory(capsys):
    """Seed 002's A3 recipe ran at 120 TPS/card: it fits (vocab-parallel logits), and `plan` and `memory` give one
    verdict on the same input -- a memory FAIL is never PLAN VALID."""
    code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--recipe", str(SEED002), "--json")
    memory = json.loads(out)
    assert code == 0 and memory["passed"], [p for p in memory["phases"] if not p["fits"]]
    for argv, fits in ((["--recipe", str(SEED002)], True),
                       (["--recipe", str(SEED002), "--", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"],
                        False)):
        code, out, _ = _run(capsys, "plan", "--scale", "full-a3", *argv[:2], "--json", *argv[2:])
        doc = json.loads(out)
        assert doc["memory"]["fits"] is fits
        assert code == (0 if doc["passed"] else 1)
        if not fits:
            assert doc["passed"] is False and doc["state"] == "INVALID"
            code, out, _ = _run(capsys, "plan", "--scale", "full-a3", *argv)
            assert code == 1 and "PLAN INVALID" in out and "plan valid" not in out


def test_world_smaller_than_the_plan_is_one_line_exit_2(capsys):
    code, out, err = _run(capsys, "plan", "--scale", "full-a3", "--", "trainer.nnodes=1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "smaller than one replica" in err and "trainer.nnodes" in err
