"""The pytest plugin in throw-away sessions (pytester): options, markers, requires(), scale selection,
and --strict-hardware, which must turn every hardware skip into a failure naming what is missing."""
from __future__ import annotations

import pytest

from harness.config import hardware as hw
from harness.config.scales import TIERS
from harness.markers import HARDWARE_MARKERS, TIER_MARKERS, requires

# These sessions assert what is skipped on a CPU-only machine (the CI tier).
pytestmark = pytest.mark.skipif(hw.detect().kind != "cpu", reason="asserts the skips of a CPU-only machine")

SUITE = """
import pytest
from harness.markers import requires

@pytest.mark.tiny
def test_tiny(scale):
    assert scale.name == "tiny"

@pytest.mark.full
def test_full(scale):
    assert scale.tier == "full"

@pytest.mark.npu
def test_npu_marker():
    pass

@requires(hardware="a3", cards=128)
def test_a3_cluster():
    pass

@requires(packages=["no_such_package_for_harness_selftest"])
def test_missing_package():
    pass

@requires(packages=["json"])
def test_present_package():
    pass

def test_device(device):
    assert device == "cpu"
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _skip_reasons(result: pytest.RunResult) -> str:
    return "\n".join(line for line in result.outlines if line.startswith("SKIPPED"))



def test_tier_markers_are_the_scale_tiers():
    assert tuple(TIER_MARKERS) == TIERS  # one vocabulary: the markers a suite uses are the tiers scales have


def test_markers_are_listed(pytester: pytest.Pytester):
    result = pytester.runpytest("--markers")
    text = result.stdout.str()
    missing = [m for m in (*TIER_MARKERS, *HARDWARE_MARKERS, "nightly") if f"@pytest.mark.{m}:" not in text]
    assert not missing, f"{len(missing)} markers not registered: {missing}"
    assert "@pytest.mark.requires(hardware=None, cards=None" in text


def test_options_are_registered(pytester: pytest.Pytester):
    text = pytester.runpytest("--help").stdout.str()
    options = ("--scale", "--hardware", "--strict-hardware", "--report-dir", "--baseline", "--run-dir",
               "--engine", "--ray-address")
    assert not [o for o in options if o not in text]


def test_markers_are_strict(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.tinny\ndef test_typo():\n    pass\n")
    result = pytester.runpytest("--strict-markers")
    result.stdout.fnmatch_lines(["*'tinny' not found in `markers` configuration option*"])


def test_missing_hardware_skips_with_reason(suite):
    reprec = suite.inline_run()
    reprec.assertoutcome(passed=3, skipped=4)
    reasons = {r.nodeid.split("::")[-1]: r.longrepr[2]
               for r in reprec.getreports("pytest_runtest_logreport") if r.skipped}
    expected = {
        "test_full": ["missing hardware a3", "256 devices; found 0", "a Ray cluster (--ray-address)"],
        "test_npu_marker": ["missing hardware npu", "found cpu"],
        "test_a3_cluster": ["missing hardware a3", "128 cards; found 0"],
        "test_missing_package": ["missing package no_such_package_for_harness_selftest"],
    }
    for test, needles in expected.items():
        assert all(n in reasons.get(test, "") for n in needles), f"{test}: {reasons.get(test)!r} lacks {needles}"
    # the skip is reported at the test, not inside the plugin
    skip_lines = [line for line in suite.runpytest("-rs").outlines if line.startswith("SKIPPED")]
    assert len(skip_lines) == 4 and all("test_suite.py:" in line for line in skip_lines), skip_lines


def test_strict_hardware_fails_naming_what_is_missing(suite):
    # the nightly must never go green by skipping: `pytest -m full --strict-hardware` on a CPU machine
    # (the failure is raised in setup, so pytest counts it as an error; the session fails either way)
    result = suite.runpytest("-m", "full", "--strict-hardware")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1, deselected=6)
    result.stdout.fnmatch_lines(["*--strict-hardware: missing hardware a3 (needs Atlas A3*found cpu*"])
    result = suite.runpytest("-m", "full")
    result.assert_outcomes(skipped=1, deselected=6)


def test_strict_hardware_covers_markers_and_requires(suite):
    result = suite.runpytest("--strict-hardware")
    result.assert_outcomes(passed=3, errors=4)
    result.stdout.fnmatch_lines(["*--strict-hardware: missing package no_such_package_for_harness_selftest*"])


def test_strict_hardware_keeps_a_skip_no_run_of_this_hardware_could_avoid(pytester: pytest.Pytester):
    """A CPU night (--hardware cpu --strict-hardware) failed 7 tests it can never run: vLLM's sleep mode, which
    needs a GPU/NPU, and AMX tiles, which no --hardware choice promises. Such a skip says so and stays a skip; any
    other still fails (the seeded bug, strict=False ignored, passes neither way)."""
    pytester.makepyfile(test_needs="""
from harness.markers import skip_or_fail

def test_sleep_mode(pytestconfig):
    skip_or_fail(pytestconfig, "a GPU/NPU for vLLM's sleep mode", strict=False)

def test_package(pytestconfig):
    skip_or_fail(pytestconfig, "package foo")
""")
    result = pytester.runpytest("--strict-hardware", "--hardware", "cpu", "-rs")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*--strict-hardware: missing package foo*",
                                 "SKIPPED*missing a GPU/NPU for vLLM's sleep mode*"])


def test_scale_option_deselects_other_tiers(suite):
    result = suite.runpytest("--scale", "tiny")
    result.assert_outcomes(passed=3, skipped=3, deselected=1)  # test_full deselected, untiered tests kept
    result = suite.runpytest("--scale", "full-a2-gbs128", "-rs", "-k", "tiny or full")
    result.assert_outcomes(skipped=1, deselected=6)
    assert "missing hardware a2" in _skip_reasons(result)


SCALE_ONLY = """
import pytest

@pytest.mark.full
@pytest.mark.scales("full-a3")
def test_a3_target(scale):
    assert scale.name == "full-a3"
"""


def test_scales_marker_selects_by_scale(pytester: pytest.Pytester):
    """The A3 TPS target applies to full-a3 only: on an A2 nightly (--scale full-a2-gbs128 --strict-hardware) it is
    deselected, so the night can pass; at full-a3 it is selected and needs its hardware."""
    pytester.makepyfile(test_only=SCALE_ONLY)
    result = pytester.runpytest("--scale", "full-a2-gbs128", "--strict-hardware")
    result.assert_outcomes(deselected=1)
    result = pytester.runpytest("--scale", "full-a3", "--strict-hardware")
    result.assert_outcomes(errors=1)  # selected: this CPU machine is no A3 (fails in setup)
    result.stdout.fnmatch_lines(["*--strict-hardware: missing hardware a3*"])
    result = pytester.runpytest("-m", "full")  # no --scale: the tier's default on this hardware (full-a3)
    result.assert_outcomes(skipped=1)


def test_scales_marker_with_unknown_scale_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_only=SCALE_ONLY.replace('"full-a3"', '"full-a4"'))
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_scale_fixture_needs_a_tier(pytester: pytest.Pytester):
    pytester.makepyfile("def test_untiered(scale):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*uses the `scale` fixture but has no tier marker and no --scale*"])


def test_absent_hardware_option_is_a_usage_error(pytester: pytest.Pytester):
    result = pytester.runpytest("--hardware", "a3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hardware a3 requested but this machine has cpu*"])


def test_unknown_scale_is_a_usage_error(pytester: pytest.Pytester):
    result = pytester.runpytest("--scale", "full-a4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--scale: invalid choice: 'full-a4'*"])


@pytest.mark.parametrize("target, words", [("os:getcwd", "not an engine factory"), ("os", "MODULE:FACTORY"),
                                           ("no_such_mod_xyz:f", "cannot import")])
def test_bad_engine_is_one_usage_error_up_front(pytester: pytest.Pytester, target, words):
    """A bad --engine stops the session at configure time (exit 4), not inside every MLA test."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--engine", target)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "--engine" in line]
    assert len(errors) == 1 and words in errors[0], result.errlines


def test_broken_torch_npu_is_a_one_line_usage_error(pytester: pytest.Pytester, broken_torch_npu):
    # torch_npu installed without CANN: the session must stop with one line saying what to do.
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "torch_npu" in line]
    assert len(errors) == 1 and "set_env.sh" in errors[0] and "libhccl.so" in errors[0], result.errlines


def test_requires_rejects_unknown_hardware():
    with pytest.raises(ValueError, match="requires\\(hardware='a4'\\): use one of cpu, gpu, npu, a2, a3"):
        requires(hardware="a4")


def test_mla_suites_skip_only_through_skip_or_fail():
    """A bare pytest.skip / importorskip in a suite would bypass --strict-hardware."""
    import ast
    from pathlib import Path

    from fixtures.engines import MLA_SUITES

    root = Path(__file__).resolve().parents[1] / "suites"
    files = [p for p in root.rglob("test_*.py") if p.name in MLA_SUITES]
    assert len(files) == len(MLA_SUITES)
    bare = [f"{p.name}:{node.lineno}" for p in files for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("skip", "importorskip") and getattr(node.func.value, "id", "") == "pytest"]
    assert not bare, f"bare skips (use harness.markers.skip_or_fail): {bare}"


RECIPE_SUITE = """
import pytest
from fixtures.dapo import session_tiny_verl

@pytest.mark.tiny
def test_the_session_run_rehearses_the_recipe(pytestconfig):
    launch = session_tiny_verl(pytestconfig)
    argv = launch.argv()
    assert argv[argv.index("--recipe") + 1] == {recipe!r}
    assert launch.home.name.startswith("tiny-verl-s1234-recipe-")

@pytest.mark.tiny
def test_no_golden_of_this_recipe_is_not_judged_against_the_built_in_one(alignment_baseline):
    pass
"""


def test_recipe_runs_the_teams_job_and_wants_its_own_golden(pytester: pytest.Pytester):
    """--recipe: the tiny tier's verl run is the user's recipe rehearsed (not the built-in DAPO job, whose golden
    baselines/tiny/dapo_verl.json is then no reference: the curve test asks for the recipe's own golden)."""
    recipe = pytester.path / "team.sh"
    recipe.write_text("python3 -m verl.trainer.main_ppo trainer.total_training_steps=5 actor_rollout_ref.actor.optim"
                      ".lr=1e-6\n")
    # a name no module of tests/ has (in-process pytester shares sys.modules with this session: tests/test_recipe.py)
    pytester.makepyfile(test_team_recipe_tier=RECIPE_SUITE.format(recipe=str(recipe.resolve())))
    result = pytester.runpytest("-p", "fixtures.dapo", "--recipe", str(recipe), "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*a golden recorded from this recipe's own runs*"])
    strict = pytester.runpytest("-p", "fixtures.dapo", "--recipe", str(recipe), "--strict-hardware")
    strict.assert_outcomes(passed=1, errors=1)


def test_a_recipe_the_launcher_would_refuse_is_a_usage_error_up_front(pytester: pytest.Pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--recipe", str(pytester.path / "missing.sh"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--recipe*missing.sh*"])
