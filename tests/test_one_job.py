"""One job, one truth (issue 44, issue 48's number checks): `memory`, `plan`, the perf model and every `launch` mode
judge the job as it will run -- its own overrides, else the installed verl's defaults -- and refuse the numbers a run
would refuse, where they enter."""
from __future__ import annotations

import json
import math

import pytest

from harness.cli import main
from harness.config.job import build_job
from harness.config.recipe import compose
from harness.config.scales import SCALES, get_scale
from harness.config.user_recipe import UserRecipe
from harness.memory.job_options import judge, memory_options

MG, RO = "actor_rollout_ref.actor.megatron", "actor_rollout_ref.rollout"
NO_OFFLOAD = (f"{MG}.param_offload=False", f"{MG}.optimizer_offload=False")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _job(scale: str, *overrides: str):
    user = UserRecipe(source="the command line", overrides=overrides) if overrides else None
    return build_job(get_scale(scale), user)


# --------------------------------------------------------------------------------------------------- the job's settings

@pytest.mark.parametrize("name", sorted(SCALES))
def test_memory_reads_what_the_composed_job_runs(name):
    """The seeded drift of issue 44: MemoryOptions assumed param/grad/optimizer offload and 0.8 of the device for
    vLLM while the scale's job set none of them (verl 0.9.1 composes them False and 0.5). Every setting the model
    reads equals what verl composes for the job."""
    job = build_job(SCALES[name])
    options = memory_options(job).options
    config = compose(job.recipe)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    engine = actor.megatron if job.values.get("model_engine") == "megatron" else actor.fsdp_config  # tiny: FSDP
    assert options.param_offload == engine.param_offload
    assert options.optimizer_offload == engine.optimizer_offload
    assert options.grad_offload == engine.param_offload  # verl 0.9.1: param_offload releases the grad buffers
    assert options.gpu_memory_utilization == rollout.gpu_memory_utilization
    assert options.max_num_seqs == rollout.max_num_seqs
    assert options.max_num_batched_tokens == rollout.max_num_batched_tokens


def test_a_scale_that_assumes_an_offload_its_job_drops_fails():
    """full-a3 fits because its job offloads (seed 002 did); the same job without the offloads is the ~114 GiB job
    the issue measured, and the verdict follows the job, not the scale."""
    job = _job("full-a3")
    assert judge(job).fits
    drifted = _job("full-a3", *NO_OFFLOAD)
    verdict = judge(drifted)
    assert not verdict.fits and not memory_options(drifted).options.param_offload
    assert max(p.peak_gib for p in verdict.phases) > 100


def test_every_swap_optimizer_spelling_is_the_same_mechanism():
    """verl's r1_ascend recipe writes +override_transformer_config.swap_optimizer, cann-recipes-train's fork a megatron
    key: both are MindSpeed's swap optimizer (issue 44: the first was "not modelled" and called OOM at 70 GiB)."""
    plain = _job("full-a3", f"{MG}.optimizer_offload=False")
    spellings = [_job("full-a3", f"{MG}.optimizer_offload=False", f"+{MG}.override_transformer_config.swap_optimizer"
                                                                    "=True"),
                 _job("full-a3", f"{MG}.optimizer_offload=False", f"+{MG}.swap_optimizer=True")]
    assert not memory_options(plain).options.optimizer_offload
    peaks = []
    for job in spellings:
        memory = memory_options(job)
        assert memory.options.optimizer_offload
        assert not any("swap_optimizer" in item for item in memory.unmodelled)
        peaks.append([p.peak_gib for p in judge(job).phases])
    assert peaks[0] == peaks[1] and peaks[0] != [p.peak_gib for p in judge(plain).phases]


def test_a_kv_pool_that_holds_no_sequence_fails(capsys):
    """vLLM refuses to start without room for one sequence; `memory` said PASS on a 0.00 GiB pool."""
    code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--", f"{RO}.gpu_memory_utilization=0.4")
    assert code == 1 and "vLLM cannot start" in out and "FAIL" in out
    code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--json", "--", f"{RO}.gpu_memory_utilization=0.4")
    rollout = next(p for p in json.loads(out)["phases"] if p["phase"] == "rollout")
    assert rollout["fits"] is False and rollout["components_gib"]["kv_cache"] == 0 and rollout["refused"]


# ---------------------------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("command,override", [
    ("memory", f"{RO}.gpu_memory_utilization=-1"),
    ("memory", f"{RO}.gpu_memory_utilization=0"),
    ("memory", f"{RO}.gpu_memory_utilization=1.5"),
    ("memory", f"{RO}.max_num_seqs=0"),
    ("memory", f"{RO}.max_model_len=2048"),  # below full-a3's 1024 + 3072
    ("plan", "actor_rollout_ref.actor.optim.lr=inf"),
    ("plan", f"{RO}.temperature=nan"),
    ("plan", f"{RO}.top_p=0"),
    ("plan", "algorithm.kl_ctrl.kl_coef=-inf"),
])
def test_an_out_of_range_number_is_one_line_exit_2(capsys, command, override):
    code, out, err = _run(capsys, command, "--scale", "full-a3", "--", override)
    key = override.partition("=")[0]
    assert code == 2 and out == "" and key in err and len(err.strip().splitlines()) == 1, err


def test_memory_names_the_keys_it_drops(capsys):
    code, out, _ = _run(capsys, "memory", "--scale", "full-a3", "--", f"{RO}.gpu_memory_utilisation=0.5")
    assert code == 0 and f"dropped, not in verl 0.9.1's config (launch refuses it): {RO}.gpu_memory_utilisation " \
                          f"(did you mean {RO}.gpu_memory_utilization?)" in out.replace("\n", " ")


# ---------------------------------------------------------------------------------------------------- launch

def test_every_launch_mode_applies_model_path_and_keeps_the_steps(tmp_path):
    """`launch --k8s` rebuilt the job without --model-path (then refused the placeholder its message said the flag
    replaces) and appended trainer.total_training_steps=20 after the recipe's =10."""
    from harness.launch.jobs import job_for_scale
    from harness.launch.k8s import manifest

    scale = get_scale("full-a3")
    user = UserRecipe(source="the command line", overrides=("actor_rollout_ref.model.path=<path_to_dsv3>",
                                                            "trainer.total_training_steps=10"))
    job = build_job(scale, user, model_path="/mnt/models/DeepSeek-V3", data_dir="/mnt/data")
    *_, volcano = manifest(scale, job=job, model_path="/mnt/models/DeepSeek-V3", data_dir="/mnt/data")
    head = next(t for t in volcano["spec"]["tasks"] if t["name"] == "head")
    k8s = head["template"]["spec"]["containers"][0]["command"][-1]
    ray = job_for_scale(scale, tmp_path, user=user, model_path="/mnt/models/DeepSeek-V3",
                        data_dir="/mnt/data").entrypoint
    for command in (k8s, ray):
        assert "actor_rollout_ref.model.path=/mnt/models/DeepSeek-V3" in command and "<path_to_dsv3>" not in command
        assert command.count("trainer.total_training_steps=") == 1 and "trainer.total_training_steps=10" in command
    *_, volcano = manifest(scale, job=job, model_path="/mnt/models/DeepSeek-V3", data_dir="/mnt/data", steps=7)
    command = next(t for t in volcano["spec"]["tasks"] if t["name"] == "head")["template"]["spec"]["containers"][0][
        "command"][-1]
    assert command.count("trainer.total_training_steps=") == 1 and "trainer.total_training_steps=7" in command


@pytest.mark.parametrize("mode", [["--k8s"], ["--ray-address", "http://127.0.0.1:9"], ["--local"]])
def test_launch_refuses_what_plan_calls_invalid_in_every_mode(capsys, mode):
    code, out, err = _run(capsys, "launch", "--scale", "full-a3", *mode, "--", *NO_OFFLOAD)
    assert code == 2 and out == "" and "PLAN INVALID: memory does not fit" in err
    code, _, err = _run(capsys, "plan", "--scale", "full-a3", "--", *NO_OFFLOAD)
    assert code == 1


def test_the_k8s_host_memory_follows_the_jobs_offloads():
    """The pod's host-memory request was sized for offloads the job never turned on (moonlight-a2 sets none)."""
    from harness.launch.k8s import manifest

    def memory(scale: str, *overrides: str) -> str:
        *_, volcano = manifest(get_scale(scale), job=_job(scale, *overrides), model_path="/m/x", data_dir="/d")
        return volcano["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]

    gib = {name: int(memory(name).rstrip("Gi")) for name in ("full-a3", "moonlight-a2")}
    assert int(memory("full-a3", *NO_OFFLOAD).rstrip("Gi")) < gib["full-a3"]
    assert int(memory("moonlight-a2", f"{MG}.param_offload=True", f"{MG}.optimizer_offload=True").rstrip("Gi")) \
        > gib["moonlight-a2"]


def test_plan_verl_cli_says_why_it_exits_1(capsys):
    code, out, err = _run(capsys, "plan", "--scale", "full-a3", "--format", "verl-cli", "--", *NO_OFFLOAD)
    assert code == 1 and "main_ppo" in out and "PLAN INVALID: memory does not fit" in err


# ---------------------------------------------------------------------------------------------------- plan's length

def _rows(text: str, width: int = 80) -> int:
    return sum(max(1, math.ceil(len(line) / width)) for line in text.splitlines())


def test_plan_fits_one_screen_and_explain_holds_the_rest(capsys, monkeypatch):
    """issue 47: plan printed 78 lines for full-a3, with a 684-character trust line and the sweep on one line."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3")
    assert code == 0 and _rows(out) <= 30, out
    assert "predicted:" in out and "memory: every phase fits" in out and "plan valid" in out
    assert "trust:" not in out and "what-if" not in out
    code, explained, _ = _run(capsys, "plan", "--scale", "full-a3", "--explain")
    assert "trust:" in explained and "knob" in explained and "rollout_tp" in explained
    assert f"  {MG}.param_offload=True\n" in explained  # every override, one a line


# ---------------------------------------------------------------------------------------------------- agreement

@pytest.mark.parametrize("name", [n for n in SCALES if SCALES[n].tier != "tiny"])
def test_memory_plan_and_launch_agree_on_every_phase(capsys, name):
    code_memory, out, _ = _run(capsys, "memory", "--scale", name, "--json")
    memory = {p["phase"]: p["fits"] for p in json.loads(out)["phases"]}
    code_plan, out, _ = _run(capsys, "plan", "--scale", name, "--json")
    plan = {p["phase"]: p["fits"] for p in json.loads(out)["memory"]["phases"]}
    assert memory == plan
    fits = all(memory.values())
    assert (code_memory == 0) == (code_plan == 0) == fits
    from harness.cli.launch_cmd import _refuse_invalid  # the gate of every launch mode (--k8s, Ray, --local)

    if fits:
        assert _refuse_invalid(build_job(SCALES[name]), force=False) is None
    else:
        with pytest.raises(Exception, match="PLAN INVALID"):
            _refuse_invalid(build_job(SCALES[name]), force=False)


# ---------------------------------------------------------------------------------------------------- ignored keys

def test_legacy_reward_keys_are_a_note_and_a_strict_refusal(capsys):
    """verl 0.9.1's main_ppo never migrates reward_model.* (only fully_async_main calls migrate_legacy_reward_impl):
    the 671B DAPO script's reward manager and overlong shaping were planned, launched and ignored without a word."""
    legacy = ("reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512")
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--", *legacy)
    flat = out.replace("\n", " ")
    assert code == 0 and "main_ppo ignores 2 legacy key(s)" in flat
    assert "reward_model.reward_manager (verl reads reward.reward_manager.name)" in flat
    code, out, err = _run(capsys, "plan", "--strict", "--scale", "full-a3", "--", *legacy)
    assert code == 2 and out == "" and "--strict" in err and "reward_model.reward_manager" in err
    assert _run(capsys, "plan", "--strict", "--scale", "full-a3")[0] == 0


# ---------------------------------------------------------------------------------------------------- what the job is

def _script(tmp_path, *lines: str) -> str:
    path = tmp_path / "run.sh"
    path.write_text("python3 -m " + " \\\n    ".join(lines) + "\n")
    return str(path)


def test_a_distilled_model_is_not_its_teachers(capsys, tmp_path):
    """Any name holding DeepSeek-R1 was DSV3 671B: a DeepSeek-R1-Distill-Qwen-1.5B Megatron job planned as 671B."""
    script = _script(tmp_path, "verl.trainer.main_ppo", "model_engine=megatron",
                     "actor_rollout_ref.model.path=/models/DeepSeek-R1-Distill-Qwen-1.5B")
    code, out, err = _run(capsys, "plan", "--recipe", script)
    assert code == 2 and "DeepSeek-R1-Distill-Qwen-1.5B" in err and "not a model the harness models" in err
    model = tmp_path / "DeepSeek-R1-Distill-Qwen-1.5B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 28,
                                                   "hidden_size": 1536}))
    code, _, err = _run(capsys, "plan", "--recipe", script, "--model-path", str(model))
    assert code == 2 and "model_type 'qwen2'" in err


def test_a_veomni_and_a_generation_job_get_their_true_cause(capsys, tmp_path):
    veomni = _script(tmp_path, "verl.trainer.main_ppo", "model_engine=veomni",
                     "actor_rollout_ref.model.path=/models/DeepSeek-V3")
    code, _, err = _run(capsys, "plan", "--recipe", veomni)
    assert code == 2 and "its engine is veomni" in err
    generation = _script(tmp_path, "verl.trainer.main_generation_server", "model.path=/models/DeepSeek-V3")
    code, _, err = _run(capsys, "plan", "--recipe", generation)
    assert code == 2 and "generation job" in err and "names no model" not in err


def test_the_router_replay_blocker_is_found_however_the_mode_is_spelled():
    from harness.config.known_bugs import check, stack_versions

    old_core = {**stack_versions("vllm-ascend-0.23.0"), "megatron-core": "0.13.1"}
    for key in (f"{MG}.router_replay.mode", "actor_rollout_ref.actor.router_replay.mode"):
        hits = {h.bug.id for h in check(old_core, {key: "R3"}, {})}
        assert "router-replay-megatron-core-before-0.14" in hits, key


def test_doctor_applies_the_mla_rows_only_to_an_mla_job(capsys):
    """seed 001's MindSpeed with flash attention is the MLA softmax-scale bug for DeepSeek-V3, and no bug for a Qwen
    job (issue 44: doctor applied DSV3-only rules to non-DSV3 scripts)."""
    flash = f"+{MG}.override_transformer_config.use_flash_attn=True"
    for path, hit in (("/models/DeepSeek-V3", True), ("/models/Qwen2.5-7B-Instruct", False),
                      ("/models/DeepSeek-R1-Distill-Qwen-1.5B", False), ("/models/${MODEL}", True)):
        _, out, _ = _run(capsys, "doctor", "--stack", "seed-001", "--", flash, f"actor_rollout_ref.model.path={path}")
        assert ("HIT  mindspeed-mla-softmax-scale" in out) == hit, (path, out)
