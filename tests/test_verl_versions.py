"""`plan --verl VERSION`: a job validated against the verl it runs on, from that release's own shipped config schema
(issue 44: a team on verl 0.7 got no validation, and no verdict said which verl it validated against). The schema is
fetched from the package index once and cached under the harness cache, so repeated runs cost no download; with no
index reachable these tests skip, naming why."""
from __future__ import annotations

import pytest

from harness.cli import main
from harness.config.recipe import ENTRYPOINT, Recipe, dropped_keys, validate_against, verl_schema_dir
from harness.errors import BadInput, RecipeError

MG = "actor_rollout_ref.actor.megatron"


def _schema(version: str):
    try:
        return verl_schema_dir(version)
    except BadInput as exc:
        if "cannot fetch" in str(exc) or "600 s" in str(exc):
            pytest.skip(f"the package index is unreachable: {exc}")
        raise


def _recipe(*overrides: str) -> Recipe:
    return Recipe(scale="the command line", entrypoint=ENTRYPOINT, overrides=("model_engine=megatron", *overrides))


def test_a_key_verl_dropped_is_valid_on_the_verl_that_had_it():
    """verl 0.4.1's megatron config has grad_offload; 0.9.1 folded it into param_offload (its schema names it)."""
    schema = _schema("0.4.1")
    assert (schema / "ppo_megatron_trainer.yaml").is_file()
    recipe = _recipe(f"{MG}.grad_offload=True")
    validate_against(recipe, "0.4.1")
    assert any(item.startswith(f"{MG}.grad_offload ") for item in dropped_keys(recipe))  # the installed 0.9.1


def test_a_key_newer_verl_added_is_refused_by_the_older_one():
    """algorithm.filter_groups (DAPO's dynamic sampling in the trainer's own config) came after 0.7.1."""
    _schema("0.7.1")
    recipe = _recipe("algorithm.filter_groups.enable=True")
    with pytest.raises(RecipeError, match=r"not in verl 0\.7\.1's config: algorithm\.filter_groups\.enable"):
        validate_against(recipe, "0.7.1")
    assert not dropped_keys(recipe)  # 0.9.1 has it


def test_the_schema_is_built_once(monkeypatch):
    first = _schema("0.7.1")

    def no_download(*args, **kwargs):
        raise AssertionError("the cached schema was fetched again")

    monkeypatch.setattr("subprocess.run", no_download)
    assert verl_schema_dir("0.7.1") == first


def test_plan_names_the_verl_it_validated_against(capsys):
    _schema("0.7.1")
    code = main(["plan", "--scale", "full-a3", "--verl", "0.7.1", "--", "~algorithm.filter_groups.enable",
                 "~algorithm.filter_groups.metric"])
    out = capsys.readouterr().out
    assert code == 0 and "verl 0.7.1 accepts the overrides" in out
    assert main(["plan", "--scale", "full-a3", "--verl", "0.7.1"]) == 2
    assert "verl 0.7.1's config: algorithm.filter_groups.enable" in capsys.readouterr().err


def test_a_version_that_is_none_is_one_line(capsys):
    assert main(["plan", "--scale", "full-a3", "--verl", "latest; rm -rf /"]) == 2
    assert "--verl" in capsys.readouterr().err
