"""Self-test of suites/precision/test_advantage_definition.py: each of its checks fails on verl with the regression
it exists for and passes on the installed verl. The seeds are the real function and the real composed config with
one default flipped, as an upgrade would flip it (the gate's seeded wheel flips the first in verl's source:
tests/test_gate.py)."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

SUITE = Path(__file__).parents[1] / "suites" / "precision" / "test_advantage_definition.py"


@pytest.fixture
def suite():
    spec = importlib.util.spec_from_file_location("advantage_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_function_check_fails_on_dr_grpo_and_passes_on_verl(suite, monkeypatch):
    from verl.trainer.ppo import core_algos

    suite.test_verl_grpo_advantage_is_the_group_normalised_reward(lambda *a: None)
    seeded = functools.partial(core_algos.compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=False)
    monkeypatch.setattr(core_algos, "compute_grpo_outcome_advantage", seeded)
    with pytest.raises(AssertionError, match=r"off the group-normalised reward \(0 off the unscaled Dr. GRPO form\)"):
        suite.test_verl_grpo_advantage_is_the_group_normalised_reward(lambda *a: None)


def test_the_config_check_fails_when_verl_stops_scaling_by_std(suite, monkeypatch):
    from harness.config import recipe

    suite.test_verl_config_scales_the_grpo_advantage_by_std()
    real = recipe.compose

    def flipped(r):
        config = real(r)
        config.algorithm.norm_adv_by_std_in_grpo = False
        return config

    monkeypatch.setattr(recipe, "compose", flipped)
    with pytest.raises(AssertionError, match="no longer True"):
        suite.test_verl_config_scales_the_grpo_advantage_by_std()
