"""Validate before booking (issue 30): every key verl's config lacks is named at once with the closest one verl has,
a `<placeholder>` is refused, interpolations resolve, and a script's `${HOME}` reaches the job's shell expandable
(it was single-quoted, and OmegaConf failed on it). Composition imports the installed verl 0.9.1 (~20 s once)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from harness.config.recipe import ENTRYPOINT, Recipe, shell_word, validate_recipe
from harness.errors import RecipeError

pytestmark = pytest.mark.filterwarnings("ignore")
MG = "actor_rollout_ref.actor.megatron"


def _recipe(*overrides: str) -> Recipe:
    return Recipe(scale="t", entrypoint=ENTRYPOINT, overrides=("model_engine=megatron", *overrides))


def test_every_unknown_key_at_once_with_did_you_mean():
    with pytest.raises(RecipeError) as exc:
        validate_recipe(_recipe(f"{MG}.grad_offload=True", "actor_rollout_ref.rollout.tensor_model_paralel_size=4",
                                "trainer.nnodes=2"))
    message = str(exc.value)
    assert "2 key(s) not in verl 0.9.1's config" in message
    assert "did you mean actor_rollout_ref.rollout.tensor_model_parallel_size?" in message
    assert f"{MG}.grad_offload (did you mean {MG}.param_offload?)" in message


def test_placeholders_are_refused():
    with pytest.raises(RecipeError, match="placeholder to fill in: actor_rollout_ref.model.path=<path_to_dsv3_config>"):
        validate_recipe(_recipe("actor_rollout_ref.model.path=<path_to_dsv3_config>"))


def test_a_dangling_interpolation_is_named():
    with pytest.raises(RecipeError, match="does not resolve"):
        validate_recipe(_recipe("trainer.project_name=${data.no_such_key}"))


def test_shell_references_are_not_interpolations():
    from harness.config.recipe import dapo_recipe
    from harness.config.scales import get_scale

    recipe = dapo_recipe(get_scale("full-a3")).with_overrides(["trainer.default_local_dir=${HOME}/ckpt"])
    validate_recipe(recipe)  # the job's shell fills it in; OmegaConf never sees ${HOME}


@pytest.mark.parametrize("word", ["trainer.default_local_dir=${HOME}/verl", "x=${data.max_prompt_length}",
                                  "y=$(rm -rf /) `id` \"q\" \\ ${USER}x", "plain"])
def test_shell_word_expands_shell_variables_and_nothing_else(word):
    quoted = shell_word(word)
    if not shutil.which("bash"):
        pytest.skip("no bash to check the quoting against")
    out = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True,
                         env={"HOME": "/h", "USER": "u"}, timeout=10).stdout
    assert out == word.replace("${HOME}", "/h").replace("${USER}", "u")


@pytest.mark.parametrize("bad, named", [
    ("actor_rollout_ref.rollout.tensor_model_paralel_size=4", "did you mean actor_rollout_ref.rollout.tensor_model"),
    (f"{MG}.grad_offload=True", f"{MG}.grad_offload"),
    ("actor_rollout_ref.model.path=<path_to_dsv3_config>", "placeholder"),
])
def test_launch_books_nothing_for_a_job_verl_rejects(capsys, tmp_path, bad, named):
    """`launch --k8s` exited 0 with a 64-node manifest for each of these (issue 30); every mode validates first."""
    from harness.cli import main

    code = main(["launch", "--scale", "full-a3", "--k8s", "--", bad])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and named in err and len(err.strip().splitlines()) == 1
    code = main(["launch", "--scale", "full-a3", "--ray-address", "http://127.0.0.1:9", "--run-dir",
                 str(tmp_path / "r"), "--", bad])  # nothing listens there: a submission would fail differently
    out, err = capsys.readouterr()
    assert code == 2 and named in err


@pytest.mark.parametrize("bad, named", [
    ("actor_rollout_ref.rollout.tensor_model_paralel_size=4", "did you mean actor_rollout_ref.rollout.tensor_model"),
    ("algorithm.adv_estimatr=grpo", "algorithm.adv_estimatr"),  # a rehearsed key: the tiny job itself is checked
])
def test_a_tiny_rehearsal_starts_nothing_for_a_job_verl_rejects(capsys, tmp_path, bad, named):
    """`launch --scale tiny --local -- <typo>` dropped the typo with the tiny scale's parallelism and ran."""
    from harness.cli import main

    code = main(["launch", "--scale", "tiny", "--local", "--run-dir", str(tmp_path / "r"), "--", bad])
    out, err = capsys.readouterr()
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_tiny_rehearsal_drops_the_forks_own_keys_as_the_forks(capsys):
    """Seeded: seed 002's script carries cann-recipes-train's `megatron.swap_optimizer`, a key the harness reads (the
    memory model's swap optimizer) but did not list among the fork's; its tiny rehearsal was refused as a typo, and
    the KL-rehearsal test on verl's real trainer skipped, every night, as if a tool were missing."""
    from harness.cli import main
    from harness.config.job import FORK_KEYS

    assert "actor_rollout_ref.actor.megatron.swap_optimizer" in FORK_KEYS
    recipe = str(__import__("pathlib").Path(__file__).parent / "recipes" / "seed002_a3_grpo.sh")
    code = main(["launch", "--scale", "tiny", "--recipe", recipe, "--k8s", "--image", "img:1"])
    assert code == 0, capsys.readouterr().err


def test_a_second_validation_comes_from_the_cache(tmp_path, monkeypatch):
    """`--validate` reported one error per 7-20 s run; an accepted recipe is remembered, a rejected one never is."""
    import time

    from harness.config.recipe import check_recipe, dapo_recipe
    from harness.config.scales import get_scale

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    recipe = dapo_recipe(get_scale("full-a3")).with_overrides(["trainer.total_epochs=3"])
    assert check_recipe(recipe) is False
    started = time.monotonic()
    assert check_recipe(recipe) is True and time.monotonic() - started < 2
    bad = recipe.with_overrides([f"{MG}.grad_offload=True"])
    for _ in range(2):
        with pytest.raises(RecipeError, match="grad_offload"):
            check_recipe(bad)
