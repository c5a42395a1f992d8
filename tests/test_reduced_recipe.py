"""The reduced tier with a team's recipe (issue 45): `pytest -m reduced --recipe R` plans R at reduced layers on one
node (harness.config.job.reduce) -- the recipe's own overrides on the reduced scale's model (deepseek-v3-4l: 3 dense +
1 MoE) with its parallel plan cut to the node -- prints each change and records it, and is rehearsed here on CPU with
the memory model (and the fake-tensor prefill trace) as far as it goes."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.job import REDUCED_STEPS, build_job
from harness.config.scales import get_scale
from harness.config.user_recipe import read_recipe
from harness.errors import BadInput
from harness.launch.jobs import DEFAULT_STEPS_VERL

RECIPES = Path(__file__).parent / "recipes"
DSV3_64 = RECIPES / "dsv3_64card_dapo.sh"  # a user-style 64-card DSV3 DAPO script the harness did not write
_MG, _RO, _TC = ("actor_rollout_ref.actor.megatron", "actor_rollout_ref.rollout",
                 "actor_rollout_ref.actor.megatron.override_transformer_config")


def test_a_64_card_recipe_is_brought_up_at_reduced_layers_on_one_node_and_every_phase_fits():
    """Seeded: the reduced tier built the recipe as written (64 cards on 8 nodes, 61 layers, PP8 with stages 7/../6),
    which no single node runs, and said nothing of it."""
    from harness.memory.job_options import judge, memory_options
    from harness.memory.prefill import prefill_verdict

    scale = get_scale("reduced-a2")
    job = build_job(scale, read_recipe(str(DSV3_64)))
    assert (job.scale.nodes, job.scale.devices, job.scale.model.name) == (1, 8, "deepseek-v3-4l")
    assert job.scale.model.num_dense_layers == 3 and job.scale.model.num_moe_layers == 1 and job.plan_error is None
    changed = {c.key: (c.before, c.after) for c in job.reduction}
    assert changed == {
        "actor_rollout_ref.model.path": ("/mnt/models/DeepSeek-V3", "/mnt/models/deepseek-v3-4l"),
        "trainer.nnodes": ("8", "1"),
        f"{_MG}.pipeline_model_parallel_size": ("8", "1"),
        f"{_RO}.data_parallel_size": ("8", "1"),
        f"{_RO}.expert_parallel_size": ("64", "8"),
        "data.train_batch_size": ("256", "16"),
        "trainer.total_training_steps": ("200", "20"),
        "actor_rollout_ref.actor.ppo_mini_batch_size": ("64", "16"),
        f"{_TC}.recompute_num_layers": ("8", "4"),
        f"{_TC}.num_layers_in_first_pipeline_stage": ("7", None),
        f"{_TC}.num_layers_in_last_pipeline_stage": ("6", None)}, changed
    # TP8 and EP8 fit the node as written: unchanged, as is everything of the algorithm and the lengths
    t, r = job.scale.plan.train, job.scale.plan.rollout
    assert (t.tp, t.pp, t.ep, t.etp, r.tp, r.dp, r.ep) == (8, 1, 8, 1, 8, 1, 8)
    for key, value in {"actor_rollout_ref.actor.clip_ratio_high": "0.28", f"{_RO}.n": "16",
                       "data.max_response_length": "8192", f"{_MG}.param_offload": "True",
                       "reward.reward_kwargs.overlong_buffer_cfg.len": "4096"}.items():
        assert job.values[key] == value, key
    assert f"{_TC}.num_layers_in_first_pipeline_stage" not in job.recipe.override_map()
    assert REDUCED_STEPS == DEFAULT_STEPS_VERL  # the reduced scale's own job's steps, named in two layers
    # printed as `plan` prints notes: one line per change, from -> to and why
    lines = [n for n in job.notes if n.startswith("reduced: ")]
    assert len(lines) == len(job.reduction) and "reduced: trainer.nnodes 8 -> 1 (the reduced tier runs on one a2 " \
        "node of 8 devices)" in lines
    verdict = judge(job)
    assert verdict.invalid(job) is None and verdict.fits and {p.phase for p in verdict.phases} >= {
        "rollout", "prefill", "old_log_prob", "ref_log_prob", "update"}, [(p.where, p.peak_gib) for p in verdict.phases]
    prefill = prefill_verdict(job.scale, memory_options(job).options)  # the MLA prefill on fake tensors
    assert prefill.ok, prefill.message()


def test_seed_002s_a3_fork_recipe_is_cut_to_an_a2_node():
    """A 16-die A3 node's job on the reduced scale's 8-device A2 node: the fork's stage list goes, its recompute
    (the fork's key) is cut to a stage's layers, rollout DP64 x TP2 to 4 x 2."""
    job = build_job(get_scale("reduced-a2"), read_recipe(str(RECIPES / "seed002_a3_grpo.sh")))
    changed = {c.key: (c.before, c.after) for c in job.reduction}
    assert changed["trainer.n_gpus_per_node"] == ("16", "8") and changed["trainer.nnodes"] == ("16", "1")
    assert changed[f"{_MG}.pipeline_parallel_num_layer_list"] == ("[7,7,8,8,8,8,8,7]", None)
    assert changed[f"{_RO}.data_parallel_size"] == ("64", "4")
    assert job.plan_error is None and job.scale.devices == 8 and job.scale.plan.train.pp == 2


def test_a_recipe_of_another_model_is_refused_at_the_reduced_tier():
    with pytest.raises(BadInput, match=r"moonlight-16b-a3b is not DeepSeek-V3's dims .*run the recipe at its own "
                                       r"tier"):
        build_job(get_scale("reduced-a2"), read_recipe(str(RECIPES / "idioms" / "moonlight_megatron_arrays.sh")))


TIERS = '''
import pytest

@pytest.mark.tiny
def test_here():
    pass

@pytest.mark.reduced
def test_on_the_node():
    pass
'''


def test_pytest_m_reduced_prints_the_reduction_and_skips_for_want_of_the_node(pytester: pytest.Pytester):
    """`pytest -m reduced --recipe R` prints each change and skips with the reason on CPU; a tier the session does
    not select is never planned (`-m tiny` with a recipe the reduced tier refuses runs: the plan came after -m)."""
    pytester.makepyfile(test_reduced_recipe_tiers=TIERS)
    result = pytester.runpytest("-m", "reduced", "--recipe", str(DSV3_64), "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"--recipe {DSV3_64} at scale reduced-a2: 11 change(s)",
                                 "reduced: trainer.nnodes 8 -> 1 (the reduced tier runs on one a2 node of 8 devices)",
                                 "*hardware a2*"])
    other = RECIPES / "idioms" / "moonlight_megatron_arrays.sh"
    pytester.runpytest("-m", "tiny", "--recipe", str(other)).assert_outcomes(passed=1)
    refused = pytester.runpytest("-m", "reduced", "--recipe", str(other))
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--recipe at scale reduced-a2: *moonlight-16b-a3b is not DeepSeek-V3's dims*"])


def test_launch_prints_the_reduction_it_books(capsys):
    """Seeded: `launch --scale reduced-a2 --recipe R` booked the reduced job and said nothing of what it changed
    (only `run` and the tier printed it), and launch.json's spec had no record of it."""
    import dataclasses

    from harness.cli import main
    from harness.launch.ray_job import JobSpec

    code = main(["launch", "--scale", "reduced-a2", "--recipe", str(DSV3_64), "--k8s", "--image", "img:1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "reduced: trainer.nnodes 8 -> 1" in err and "reduced: data.train_batch_size 256 -> 16" in err, err
    job = build_job(get_scale("reduced-a2"), read_recipe(str(DSV3_64)))
    spec = JobSpec("j", "true", "/r", 1, reduction=tuple(c.to_json() for c in job.reduction))
    assert {"override": "trainer.nnodes", "from": "8", "to": "1"}.items() <= \
        next(c for c in dataclasses.asdict(spec)["reduction"] if c["override"] == "trainer.nnodes").items()


def test_a_job_from_an_installed_wheel_uploads_no_site_packages(tmp_path):
    """Seeded: run from an installed wheel, REPO_ROOT is site-packages, and every Ray job uploaded all of it as its
    working dir; there the team's image has the harness, so nothing is uploaded."""
    from harness.launch.ray_job import REPO_ROOT, checkout_dir

    site = tmp_path / "site-packages"
    (site / "harness").mkdir(parents=True)
    (site / "numpy").mkdir()
    assert checkout_dir(site) is None
    assert checkout_dir(REPO_ROOT) == str(REPO_ROOT)  # this checkout: uploaded as before


def test_the_tiny_jobs_reward_function_loads_outside_a_checkout(tmp_path, monkeypatch):
    """Found by the foreign-image rehearsal (tests/test_packaging.py): from an installed wheel no working dir is
    uploaded, and the checkout-relative custom_reward_function.path left every reward worker of the tiny verl run
    dying with "Custom module file not found". verl's own loader must find it from a directory holding no checkout
    (seeded: the old path, harness/launch/tiny_task.py, raises there)."""
    from verl.utils.import_utils import load_extern_object

    from harness.config.cpu_tier import REWARD_FILE, REWARD_FUNCTION
    from harness.launch.tiny_task import compute_score

    monkeypatch.chdir(tmp_path)
    assert load_extern_object(module_path=REWARD_FILE, object_name=REWARD_FUNCTION) is compute_score
    with pytest.raises(FileNotFoundError, match="Custom module file not found"):
        load_extern_object(module_path="harness/launch/tiny_task.py", object_name=REWARD_FUNCTION)


def test_upstream_recipes_brings_each_launch_script_up_at_the_reduced_tier(tmp_path):
    """scripts/upstream-recipes --reduced, on a git tree of launch scripts as it reads the upstream mirrors (verl,
    verl-recipe, cann-recipes-train): each script is brought up on the reduced node as `pytest -m reduced --recipe`
    brings it up: the same changes, every phase fitting. Seeded: the script planned the job as written (64 cards on
    a one-node tier: no changes, INVALID)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    tree = tmp_path / "repo"
    tree.mkdir()
    shutil.copy(DSV3_64, tree / "dsv3_64card_dapo.sh")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    for argv in (["init", "-q"], ["add", "."], ["commit", "-qm", "scripts"]):
        subprocess.run(git + argv, check=True)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "scripts" / "upstream-recipes"), f"{tree}/.git@HEAD",
                           "--reduced", "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(done.stdout)
    want = build_job(get_scale("reduced-a2"), read_recipe(str(DSV3_64))).reduction
    assert row["reduced"] == f"fits, {len(want)} changes" and row["reduced_why"] is None, row
    assert row["reduction"] == [[c.key, c.before, c.after] for c in want]
