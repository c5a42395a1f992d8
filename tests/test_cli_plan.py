"""`ascend-rl-harness plan` / `scales`: JSON with the model values and the verl overrides, a verl
command line a shell really runs, and bad input as one line with exit code 2."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness.cli import main
from harness.config import recipe as recipe_module
from harness.config.hardware import module_exists
from harness.config.models import DEEPSEEK_V3
from harness.config.recipe import HCCL_BUFFSIZE_MB, Recipe, dapo_recipe, installed_verl, validate_recipe
from harness.config.scales import SCALES, get_scale


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_full_a3_json(capsys):
    code, out, _ = _run(capsys, "plan", "--scale", "full-a3", "--json")
    assert code == 0
    doc = json.loads(out)
    model = doc["model"]
    assert (model["hidden_size"], model["num_hidden_layers"], model["kv_lora_rank"], model["n_routed_experts"]) == \
        (DEEPSEEK_V3.hidden_size, 61, 512, 256)
    assert (doc["devices"], doc["cards"], doc["nodes"]) == (256, 128, 16)
    assert doc["plan"]["train"]["stage_layers"] == [6, 8, 8, 8, 8, 8, 8, 7]
    assert doc["validated_against_verl"] is None, "plan answers at once; the schema check is opt-in"
    assert doc["entrypoint"] == "verl.trainer.main_ppo" and doc["verl_version"] == installed_verl()
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in doc["overrides"]
    assert doc["env"]["HCCL_BUFFSIZE"] == str(HCCL_BUFFSIZE_MB)
    # R3 stays off: both supported stacks block it (megatron-core 0.12.1; v0.20.2rc1's vLLM < 0.22 too)
    blocked = doc["router_replay"]["blocked_on"]
    assert doc["router_replay"]["mode"] == "disabled" and not any("router_replay.mode" in o for o in doc["overrides"])
    assert [len(blocked[s]) for s in ("vllm-ascend-0.20.2rc1", "vllm-ascend-0.23.0")] == [2, 1]
    # the printed list composes in verl's config (the done-criterion), not just the one recipe built
    printed = Recipe(scale="full-a3", entrypoint=doc["entrypoint"], overrides=tuple(doc["overrides"]))
    cfg = validate_recipe(printed)
    assert cfg.actor_rollout_ref.rollout.expert_parallel_size == 128


@pytest.fixture
def fake_python(tmp_path):
    """A `python3` on PATH that reports the argv and environment the shell handed it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    probe = bin_dir / "python3"
    probe.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                     "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, sys.stdout)\n")
    probe.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the printed command line")
@pytest.mark.parametrize("scale", ["full-a3", "tiny"])
def test_verl_cli_is_a_runnable_command_line(capsys, fake_python, scale):
    code, out, _ = _run(capsys, "plan", "--scale", scale, "--format", "verl-cli")
    assert code == 0
    proc = subprocess.run(["bash", "-c", out], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{fake_python}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    recipe = dapo_recipe(get_scale(scale))
    # the shell hands verl exactly the overrides (quoting of `|`, `*`, `[...]` survives) and the env
    assert seen["argv"] == ["-m", recipe.entrypoint, *recipe.overrides]
    assert {k: seen["env"].get(k) for k in recipe.env} == dict(recipe.env)
    assert module_exists(seen["argv"][1]), "the entrypoint module is not in the installed verl"


def test_plan_text_ends_with_a_verdict(capsys):
    code, out, _ = _run(capsys, "plan", "--scale", "full-a2-gbs128", "--validate")
    assert code == 0
    assert "TP8 PP16 EP16 ETP1" in out and "rollout TP8 DP8 EP64" in out
    assert out.strip().splitlines()[-1] == f"plan valid; verl {installed_verl()} accepts the overrides"


def test_plan_says_when_it_did_not_validate(capsys):
    code, out, _ = _run(capsys, "plan", "--scale", "full-a2-gbs128")
    assert code == 0
    assert out.strip().splitlines()[-1] == \
        f"plan valid; overrides not checked against verl {installed_verl()}'s schema (--validate does, ~20 s)"


def test_plan_imports_no_verl_unless_validating():
    """`plan` answers without importing verl (or torch): the ~20 s it once took were verl's import."""
    code = ("import sys; from harness.cli import main; main(['plan', '--scale', 'full-a3', '--json']); "
            "heavy = sorted(m for m in ('verl', 'torch', 'hydra', 'ray', 'vllm') if m in sys.modules); "
            "sys.stderr.write(repr(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("[]"), proc.stderr


def test_plan_rejected_override_is_exit_2_naming_the_key(capsys, monkeypatch):
    real = dapo_recipe

    def misspelled(scale, **kw):  # seeded bug: the recipe misspells a verl key
        r = real(scale, **kw)
        return Recipe(scale=r.scale, entrypoint=r.entrypoint, env=r.env,
                      overrides=tuple(o.replace("clip_ratio_high", "clip_ratio_hi") for o in r.overrides))

    monkeypatch.setattr(recipe_module, "dapo_recipe", misspelled)
    code, out, err = _run(capsys, "plan", "--scale", "full-a3", "--json", "--validate")
    assert code == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("ascend-rl-harness plan: error:")]
    assert len(lines) == 1 and "actor_rollout_ref.actor.clip_ratio_hi" in lines[0], err


def test_bad_scale_is_exit_2_one_line():
    exe = shutil.which("ascend-rl-harness", path=os.path.dirname(sys.executable)) or shutil.which("ascend-rl-harness")
    argv = [exe] if exe else [sys.executable, "-m", "harness.cli"]
    proc = subprocess.run([*argv, "plan", "--scale", "full-a4", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"ascend-rl-harness plan: error: --scale: unknown scale 'full-a4'; known: {', '.join(SCALES)} "
        "(see `ascend-rl-harness scales`)"]


def test_scales_lists_every_scale(capsys):
    code, out, _ = _run(capsys, "scales")
    assert code == 0
    assert not [name for name in SCALES if name not in out]


@pytest.mark.parametrize("name", sorted(SCALES))
def test_plan_json_batch_says_what_the_overrides_say(name, capsys):
    # seeded: `plan --json` printed overlong_buffer_len 0 and ppo_mini_batch_size null beside overrides that
    # said 768 and 512 (the defaults were resolved only in the overrides)
    code, out, _ = _run(capsys, "plan", "--scale", name, "--json")
    doc = json.loads(out)
    overrides = dict(o.split("=", 1) for o in doc["overrides"])
    assert code == 0 and doc["passed"] is True and doc["state"] == "VALID"
    assert doc["batch"]["ppo_mini_batch_size"] == int(overrides["actor_rollout_ref.actor.ppo_mini_batch_size"])
    assert doc["batch"]["overlong_buffer_len"] == int(overrides["+reward.reward_kwargs.overlong_buffer_cfg.len"])


def test_scales_says_what_each_scale_runs_on(capsys, monkeypatch):
    # seeded: `scales` showed the layer scale as 256 A2 cards (the plan it is sharded as) while it runs on one
    # card or the CPU, and ignored COLUMNS (145 characters in an 80-column log)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run(capsys, "scales")
    assert code == 0 and all(len(line) <= 80 for line in out.splitlines()), out
    flat = " ".join(out.split())
    assert "layer (layer): deepseek-v3 on CPU or 1 card; plan 256 a2 devices = 256 cards" in flat
    assert "full-a3 (full): deepseek-v3 on 128 a3 cards on 16 nodes; plan 256 a3 dies = 128 cards" in flat
    assert "1 cpu device = 1 card" in flat  # counts agree with their nouns
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = _run(capsys, "scales")
    assert max(map(len, out.splitlines())) > 120 and "runs on" in out  # wide enough: the table


def test_doctor_and_throughput_wording(capsys, tmp_path):
    code = main(["doctor"])
    first = capsys.readouterr().out.splitlines()[0]
    assert code in (0, 1) and first.startswith("machine: cpu (profile cpu, "), first  # not "machine: cpu cpu"
    # a count from the run's meta.json is named as that, never as a --devices nobody passed
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"schema": "ascend-rl-harness/run-meta", "schema_version": 1,
                                               "name": "run", "hardware": "cpu", "devices": 1}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {
        "timing_s/step": 1.0, "perf/total_num_tokens": 100.0, "perf/throughput": 100.0}}) + "\n" for s in range(1, 5)))
    assert main(["throughput", str(run), "--hardware", "a3"]) == 2
    err = capsys.readouterr().err
    assert "--devices" not in err and "the run's meta.json devices 1" in err and "--hardware cpu" in err, err
    assert main(["throughput", str(run), "--hardware", "cpu"]) == 0
    assert "1 device = 1 cpu card, 4 steps" in " ".join(capsys.readouterr().out.split())
