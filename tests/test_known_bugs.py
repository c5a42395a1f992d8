"""Self-tests of the known-bug table (harness/config/known_bugs.py) and `doctor --recipe / --stack`: every row hits
a stack + recipe that triggers it and misses one that does not (a row without both cases fails here), versions
compare with `packaging`, the source detectors tell MindSpeed v2.2.0 from v2.3.0 and mbridge v0.15.1 from 680253f
although both report the same version, and doctor's exit code and JSON agree."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.config import known_bugs as kb
from harness.config.known_bugs import KNOWN_BUGS, check, in_range, parse_version, stack_versions

SEED002 = Path(__file__).parent / "recipes" / "seed002_a3_grpo.sh"
_RO, _MG = "actor_rollout_ref.rollout", "actor_rollout_ref.actor.megatron"
FLASH = f"{_MG}.override_transformer_config.use_flash_attn"
A3_STACK = stack_versions("vllm-ascend-0.23.0")

# id -> ((stack, values, env) that hits, (stack, values, env) that does not). Stacks are full rows with a change, so
# a miss is caused by the one difference named.
CASES = {
    "mindspeed-mla-softmax-scale": (
        ({**A3_STACK, "mindspeed": "2.2.0_core_r0.12.1"}, {FLASH: "True"}, {}),
        (A3_STACK, {FLASH: "True"}, {})),  # v2.3.0
    "verl-async-stale-absorbed-mla": (
        ({**A3_STACK, "verl": "0.7.0"}, {}, {}),
        ({**A3_STACK, "verl": "0.7.1"}, {}, {})),
    "vllm-ascend-wake-up-nz": (
        (A3_STACK, {}, {"VLLM_ASCEND_ENABLE_NZ": "1"}),
        (A3_STACK, {f"{_RO}.free_cache_engine": "False"}, {"VLLM_ASCEND_ENABLE_NZ": "1"})),
    "vllm-ascend-camem-expandable-segments": (
        (A3_STACK, {}, {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}),
        (A3_STACK, {}, {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:512"})),
    "verl-npu-sleep-level-1": (
        (A3_STACK, {}, {}),
        ({**A3_STACK, "verl": "0.8.0"}, {}, {})),
    "router-replay-r3-needs-vllm-0.22": (
        ({**A3_STACK, "vllm": "0.20.2"}, {f"{_RO}.enable_rollout_routing_replay": "True"}, {}),
        (A3_STACK, {f"{_RO}.enable_rollout_routing_replay": "True"}, {})),
    "router-replay-megatron-core-before-0.14": (  # core_v0.13.x still lacks the names; core_v0.14.0 has them
        ({**A3_STACK, "megatron-core": "0.13.1"}, {f"{_MG}.router_replay.mode": "R2"}, {}),
        ({**A3_STACK, "megatron-core": "0.14.0"}, {f"{_MG}.router_replay.mode": "R2"}, {})),
    "mbridge-rope-theta-transformers-5": (
        ({**A3_STACK, "mbridge": "0.15.1"}, {f"{_MG}.vanilla_mbridge": "True"}, {}),
        (A3_STACK, {f"{_MG}.vanilla_mbridge": "True"}, {})),  # the pinned commit 10cb17f: not ===0.15.1
    "vllm-cpu-amx-mla-packs-copies": (
        (stack_versions("cpu"), {}, {}),
        (stack_versions("cpu"), {f"{_RO}.engine_kwargs.vllm.attention_backend": "CPU_MLA"}, {})),
    "vllm-cpu-batch-invariant": (
        (stack_versions("cpu"), {f"{_RO}.full_determinism": "True"}, {}),
        (stack_versions("cpu"), {}, {})),
    "vllm-ascend-0.19-numpy-conflict": (
        (stack_versions("vllm-ascend-0.19.1rc1"), {}, {}),
        (stack_versions("vllm-ascend-0.20.2rc1"), {}, {})),
    "mla-vanilla-prefill-oom": (  # the vanilla path is gone from mla_v1.py since v0.11.0rc0
        ({**A3_STACK, "vllm-ascend": "0.10.0rc1"}, {f"{_RO}.enable_chunked_prefill": "False"}, {}),
        (A3_STACK, {f"{_RO}.enable_chunked_prefill": "False"}, {})),
    "vllm-ascend-wake-up-moe-retranspose": (  # the wake_up transpose came with v0.12.0rc1 (PR #4626)
        (A3_STACK, {}, {}),
        (A3_STACK, {f"{_RO}.free_cache_engine": "False"}, {})),
    "vllm-ascend-batch-invariant-mla-aclgraph": (
        (A3_STACK, {f"{_RO}.full_determinism": "True"}, {}),
        (A3_STACK, {f"{_RO}.full_determinism": "True", f"{_RO}.enforce_eager": "True"}, {})),
    "vllm-ascend-a2-dsv3-decode-without-torchair": (
        (A3_STACK, {"trainer.n_gpus_per_node": "8"}, {}),
        (A3_STACK, {"trainer.n_gpus_per_node": "16"}, {})),  # an A3 node
    "vllm-ascend-routed-experts-physical-ids": (  # no tag up to v0.25.1rc1 has #13268
        ({**A3_STACK, "vllm-ascend": "0.26.0rc1"},
         {f"{_RO}.enable_rollout_routing_replay": "True", f"{_RO}.expert_parallel_size": "8"}, {}),
        (A3_STACK, {f"{_RO}.enable_rollout_routing_replay": "True", f"{_RO}.expert_parallel_size": "8"}, {})),
    "verl-ep-level-2-wake-stale-expert-map": (  # verl 0.9.1 sleeps at level 1 on NPU: not hit
        ({**A3_STACK, "verl": "0.10.0"}, {f"{_RO}.expert_parallel_size": "8"}, {}),
        (A3_STACK, {f"{_RO}.expert_parallel_size": "8"}, {})),
    "logits-oom-long-responses": (
        (A3_STACK, {"data.max_response_length": "12288"}, {}),
        (A3_STACK, {"data.max_response_length": "12288", f"{_MG}.context_parallel_size": "2"}, {})),
}


# The self-test that seeds each row's bug into a stub, stand-in or seeded engine and fails the catcher the row names
# (issue 46, M4 / m3: rows named suites that could not fail on their bug). A row with no CPU catcher says "doctor is
# the check" and why.
# id -> the node id of the SEEDED case that fails its catcher on the bug (one item: a parametrised test names its
# seeded parameter). test_every_catcher_is_a_seeded_case_this_tier_runs collects them all at once.
CATCHERS = {
    "mindspeed-mla-softmax-scale": "tests/test_training_scale_probe.py::test_recorder_sees_the_v220_bug_the_"
                                   "module_hides[deepseek-v3]",
    "verl-async-stale-absorbed-mla": "tests/test_mla_seeded.py::test_seeded_engine_fails_suite[stale_copy-"
                                     "test_mla_weight_sync]",
    "vllm-ascend-wake-up-moe-retranspose": "tests/test_npu_stubs.py::test_a_moe_wake_up_without_a_sync_keeps_the_"
                                           "experts[v0.23.0-wake-up]",
    "vllm-ascend-batch-invariant-mla-aclgraph": "tests/test_mla_seeded.py::test_seeded_engine_fails_suite[split_k-"
                                                "test_batch_invariance]",
    "verl-ep-level-2-wake-stale-expert-map": "tests/test_megatron_sender.py::test_an_expert_map_kept_across_a_level_2_"
                                             "sleep_fails_the_second_sync",
    "vllm-cpu-amx-mla-packs-copies": "tests/test_host.py::test_the_amx_expectation_matches_what_the_amx_host_raised",
    "vllm-ascend-0.19-numpy-conflict": "tests/test_stacks.py::test_supported_npu_stacks_fit_verl",
    "mla-vanilla-prefill-oom": "tests/test_memory_phases.py::test_vanilla_prefill_oom_is_flagged_and_names_the_fix",
    "logits-oom-long-responses": "tests/test_memory_phases.py::test_seeded_logits_oom_is_flagged_with_its_knobs",
}
DOCTOR = "doctor is the check"
ROOT = Path(__file__).resolve().parents[1]


def _test_function(nodeid: str):
    """The module-level test function a node id names (its AST), None where there is none."""
    import ast

    path, _, test = nodeid.partition("::")
    test = test.split("[")[0]
    if not (ROOT / path).is_file():
        return None
    return next((node for node in ast.parse((ROOT / path).read_text()).body
                 if isinstance(node, ast.FunctionDef) and node.name == test), None)


def asserts_a_failure(function) -> bool:
    """The test asserts that something fails: `pytest.raises`, or an assert whose condition negates (`assert not
    finding.ok`) or reads a failure (`outcomes["failed"] == n`, `assert failures`). A test asserting only success
    (`assert check.ok`) shows that the fix passes, not that the catcher can fail."""
    import ast

    for node in ast.walk(function):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.raises":
            return True
        if isinstance(node, ast.Assert):
            for sub in ast.walk(node.test):  # the condition, not the message
                if isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not):
                    return True
                if isinstance(sub, (ast.Name, ast.Attribute, ast.Constant)) and "fail" in ast.unparse(sub).lower():
                    return True
    return False


# Collects the node ids as this tier does (pyproject's addopts: its -m, the harness plugin's deselection), and says
# per item whether it would skip here: a skip / skipif mark, or a `requires` this machine lacks (harness.plugin).
PROBE = """
import json, os
from pathlib import Path

from _pytest.skipping import evaluate_skip_marks

deselected = []


def pytest_deselected(items):
    deselected.extend(item.nodeid for item in items)


def pytest_collection_finish(session):
    from harness.markers import DETECTED_KEY
    from harness.plugin import item_need

    collected = {}
    for item in session.items:
        skip = evaluate_skip_marks(item)
        missing = item_need(item).missing(item.config.stash[DETECTED_KEY], {})
        collected[item.nodeid] = skip.reason if skip else "; ".join(missing)
    Path(os.environ["CATCHER_PROBE_OUT"]).write_text(json.dumps({"collected": collected, "deselected": deselected}))
"""


def catcher_problems(nodeids: list[str], tmp_path: Path) -> dict[str, str]:
    """node id -> why it cannot catch its bug on this tier ("" where it can): it names no test, selects other than
    one item, is deselected by the tier's markers, would skip here, or asserts no failure. One `--collect-only`
    of them all (a few seconds of imports; running them is the suite's job)."""
    import json
    import os
    import subprocess
    import sys

    from harness.config.hardware import module_exists

    problems = {n: "" if _test_function(n) else "no such test" for n in nodeids}
    runnable = [n for n in nodeids if not problems[n]]  # pytest stops on a node id it cannot find
    (tmp_path / "catcher_probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    env = {**os.environ, "CATCHER_PROBE_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "catcher_probe",
                           "--collect-only", "-q", *runnable], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.is_file(), f"the collection did not finish (exit {done.returncode}):\n{done.stdout[-3000:]}"
    probe = json.loads(out.read_text())
    for nodeid in runnable:
        mine = [n for n in probe["collected"] if n == nodeid or n.startswith(nodeid + "[")]
        function = _test_function(nodeid)
        skips = [c.args[0].value for c in _calls(function, "pytest.importorskip") if not module_exists(c.args[0].value)]
        if not mine and any(n == nodeid or n.startswith(nodeid + "[") for n in probe["deselected"]):
            problems[nodeid] = "deselected on this tier"
        elif len(mine) != 1:
            problems[nodeid] = f"selects {len(mine)} items; name the seeded one"
        elif probe["collected"][mine[0]] or skips:
            problems[nodeid] = f"would skip here: {probe['collected'][mine[0]] or 'no ' + ', '.join(skips)}"
        elif not asserts_a_failure(function):
            problems[nodeid] = "asserts no failure"
    return problems


def _calls(function, name: str) -> list:
    import ast

    return [node for node in ast.walk(function) if isinstance(node, ast.Call) and ast.unparse(node.func) == name
            and node.args and isinstance(node.args[0], ast.Constant)]


@pytest.mark.parametrize("bug", KNOWN_BUGS, ids=lambda b: b.id)
def test_every_rows_catcher_can_fail(bug):
    """A row names a suite or test that exercises its bug's mechanism, with the self-test that seeds the bug and
    fails it (CATCHERS), or says "doctor is the check" and why; every file and test it names exists."""
    import re

    if bug.id not in CATCHERS:  # doctor alone (a row may name a CPU catcher and doctor for the NPU besides)
        assert DOCTOR in bug.suite, f"{bug.id}: names {bug.suite!r} but no self-test that seeds its bug and fails it"
        assert len(bug.suite.replace(DOCTOR, "").strip(" :()")) > 10, f"{bug.id}: say why doctor is the check"
        return
    for named in re.findall(r"((?:suites|tests)/[\w/]+\.py)(?:::(\w+))?", bug.suite):
        assert (ROOT / named[0]).is_file(), f"{bug.id}: {named[0]} does not exist"
        assert not named[1] or _test_function("::".join(named)), f"{bug.id}: {'::'.join(named)} does not exist"


# Seeded catchers, each a way a row's catcher could not fail on this tier, with what the check must say.
SEEDED_CATCHERS = {
    "tests/test_npu_stubs.py::test_no_such_catcher": "no such test",
    # asserts the v2.3.0 fix passes, never the v2.2.0 bug
    "tests/test_training_scale_probe.py::test_recorder_passes_the_v230_fix[tiny-dsv3]": "asserts no failure",
    # the fixed and the seeded parameter both
    "tests/test_npu_stubs.py::test_a_moe_wake_up_without_a_sync_keeps_the_experts": "selects 2 items",
    # -m 'not regression' (pyproject addopts)
    "tests/test_tiny_verl.py::test_the_alignment_fails_a_seeded_regression_on_the_real_trainer":
        "deselected on this tier",
    "suites/memory/test_chunked_prefill.py::test_vllm_ascend_chunked_prefill_has_no_score_matrix":
        "would skip here: hardware npu",
}


def test_every_catcher_is_a_seeded_case_this_tier_runs(tmp_path):
    """Each CATCHERS node id is one item this CPU tier collects and runs (not deselected by its markers, not skipped
    here) whose test asserts a failure -- and the check says which way each seeded catcher cannot fail."""
    problems = catcher_problems([*CATCHERS.values(), *SEEDED_CATCHERS], tmp_path)
    assert {n: p for n, p in problems.items() if n in CATCHERS.values() and p} == {}
    for nodeid, want in SEEDED_CATCHERS.items():
        assert problems[nodeid].startswith(want), (nodeid, problems[nodeid])


def _ids(stack, values, env, installed=False) -> set[str]:
    return {h.bug.id for h in check(stack, values, env, installed=installed)}


def test_every_row_has_a_self_test():
    assert set(CASES) == {b.id for b in KNOWN_BUGS}, "a row without a trigger / non-trigger case, or a stale case"
    assert len({b.id for b in KNOWN_BUGS}) == len(KNOWN_BUGS)
    for bug in KNOWN_BUGS:
        assert bug.symptom and bug.fix and bug.suite and bug.source, bug.id


@pytest.mark.parametrize("bug_id", sorted(CASES))
def test_row_hits_its_trigger_and_misses_the_rest(bug_id):
    (hit_stack, hit_values, hit_env), (miss_stack, miss_values, miss_env) = CASES[bug_id]
    assert bug_id in _ids(hit_stack, hit_values, hit_env), f"{bug_id} misses its trigger"
    assert bug_id not in _ids(miss_stack, miss_values, miss_env), f"{bug_id} hits a stack + recipe without the bug"


def test_versions_compare_with_packaging():
    assert parse_version("2.2.0_core_r0.12.1") < parse_version("2.3.0_core_r0.12.1")
    assert parse_version("8.2.RC2") < parse_version("8.5.1")
    assert in_range("0.20.2rc1", ">=0.20.2rc1") and not in_range("0.19.1rc1", ">=0.20.2rc1")
    assert in_range("0.7.0.dev0", "<0.7.1") and not in_range("0.9.1", "<0.7.1")
    assert in_range("0.15.1", "===0.15.1") and not in_range("0.15.1+680253f", "===0.15.1")
    assert in_range("2.13.0+cpu", ">=2.13") and in_range(None, ">=1") is None


def test_a_host_condition_is_only_possible_for_a_named_stack(monkeypatch):
    hit = next(h for h in check(stack_versions("cpu")) if h.bug.id == "vllm-cpu-amx-mla-packs-copies")
    assert not hit.certain and "unknown" in hit.why
    monkeypatch.setitem(kb.HOST_CHECKS, "amx", lambda: True)
    hit = next(h for h in check(stack_versions("cpu"), installed=True) if h.bug.id == "vllm-cpu-amx-mla-packs-copies")
    assert hit.certain
    monkeypatch.setitem(kb.HOST_CHECKS, "amx", lambda: False)
    assert "vllm-cpu-amx-mla-packs-copies" not in _ids(stack_versions("cpu"), {}, {}, installed=True)


# The two upstream versions of the function the MindSpeed detector reads (Ascend/MindSpeed v2.2.0_core_r0.12.1 and
# v2.3.0_core_r0.12.1 mindspeed/core/transformer/flash_attention/flash_attention/adaptor.py), reduced to the lines
# that differ plus their frame.
def test_mindspeed_detector_reads_the_code_not_the_version(monkeypatch, tmp_path):
    """An installed MindSpeed that reports 0.12.1 (setup.py says so for v2.2.0 and v2.3.0) is decided by running its
    attention forward (harness.config.installed, the detector doctor's stack check uses too)."""
    from test_installed import mindspeed_tree

    from harness.config import installed

    lying = {**A3_STACK, "mindspeed": "0.12.1"}
    trees = {v: mindspeed_tree(tmp_path, v) for v in ("2.2.0", "2.3.0")}
    monkeypatch.setattr(installed, "package_root", lambda name: trees["2.3.0"] if name == "mindspeed" else None)
    assert "mindspeed-mla-softmax-scale" not in _ids(lying, {}, {}, installed=True)
    monkeypatch.setattr(installed, "package_root", lambda name: trees["2.2.0"] if name == "mindspeed" else None)
    hit = next(h for h in check(lying, installed=True) if h.bug.id == "mindspeed-mla-softmax-scale")
    assert hit.certain and "installed source" in hit.why
    monkeypatch.setattr(installed, "package_root", lambda name: None)  # cannot tell: the lying version is a risk
    hit = next(h for h in check(lying, installed=True) if h.bug.id == "mindspeed-mla-softmax-scale")
    assert not hit.certain


def test_mbridge_detector_tells_the_fixed_commit(monkeypatch, tmp_path):
    from test_installed import mbridge_tree

    from harness.config import installed

    for commit, bug in (("v0.15.1", True), ("10cb17f", False)):
        tree = mbridge_tree(tmp_path, commit)
        monkeypatch.setattr(installed, "package_root", lambda name, tree=tree: tree if name == "mbridge" else None)
        assert kb.DETECTORS["mbridge-rope-theta"]() is bug, commit


# ---------------------------------------------------------------------------------------------------- doctor

def _doctor(capsys, *argv):
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_doctor_names_the_mindspeed_bug_for_v220_with_flash_attn_not_for_v230(capsys):
    """The done criterion: seed 001's stack (MindSpeed v2.2.0_core_r0.12.1) with use_flash_attn -> the MLA scale bug,
    its symptom, fix and suite, exit 1; the v0.23.0 row (MindSpeed v2.3.0_core_r0.12.1) -> not named."""
    code, out, _ = _doctor(capsys, "--stack", "seed-001", "--", f"+{FLASH}=True")
    assert code == 1
    assert "HIT  mindspeed-mla-softmax-scale" in out and "v2.3.0_core_r0.12.1" in out
    assert "suites/precision/test_training_softmax_scale.py" in out
    assert out.strip().splitlines()[-1].startswith("KNOWN BUG:")
    code, out, _ = _doctor(capsys, "--stack", "requirements/npu-vllm-ascend-0.23.0.txt", "--", f"+{FLASH}=True")
    assert code == 0 and "mindspeed-mla-softmax-scale" not in out
    assert out.strip().splitlines()[-1].startswith("NO KNOWN BUG:")


def test_the_core_r0_16_row_is_clear_of_the_mindspeed_scale_bug(capsys):
    """Issue 46 M3: MindSpeed core_r0.16.0 versions itself 0.16.0 (< 2.3.0) yet passes self.softmax_scale, and doctor
    on that row exited 1 on a false certain HIT; `gate --dry-run` between the rows read "clear -> HIT"."""
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0-mcore-0.16", "--", f"+{FLASH}=True")
    assert code == 0 and "mindspeed-mla-softmax-scale" not in out, out
    assert main(["gate", "--dry-run", "--json", "--from", "vllm-ascend-0.23.0", "--to",
                 "vllm-ascend-0.23.0-mcore-0.16"]) == 0
    doc = json.loads(capsys.readouterr().out)
    named = {row["id"] for row in doc["known_bugs_changed"] + doc["known_bugs_range_changed"]}
    assert "mindspeed-mla-softmax-scale" not in named, doc


def test_doctor_recipe_json_agrees_with_its_exit_code(capsys):
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0", "--recipe", str(SEED002), "--json")
    doc = json.loads(out)
    assert doc["certain"] == ["vllm-ascend-camem-expandable-segments"], doc["certain"]  # the seed's alloc conf
    assert doc["passed"] is False and doc["state"] == "KNOWN BUG" and code == 1
    assert doc["table_size"] == len(KNOWN_BUGS)
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0", "--json")
    assert json.loads(out)["passed"] is True and code == 0


def test_doctor_bad_stack_is_one_line(capsys):
    code, out, err = _doctor(capsys, "--stack", "requirements/npu-nope.txt")
    assert code == 2 and out == "" and "--stack requirements/npu-nope.txt" in err and len(err.splitlines()) == 1


def test_doctor_recipe_runs_launchs_check(capsys, tmp_path):
    """`doctor --stack` said NO KNOWN BUG for a recipe verl rejects (issue 30): the same check `launch` runs now makes
    it REJECTED, exit 1, naming every key; the fork's translated keys are not among them."""
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0", "--json", "--",
                           "actor_rollout_ref.actor.megatron.grad_offload=True",
                           "actor_rollout_ref.model.path=<path_to_dsv3_config>")
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False and doc["state"] == "REJECTED" and "placeholder" in doc[
        "recipe_rejected"]
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0", "--json", "--",
                           "actor_rollout_ref.actor.megatron.grad_offload=True")
    assert "grad_offload (did you mean actor_rollout_ref.actor.megatron.param_offload?)" in json.loads(out)[
        "recipe_rejected"]
    code, out, _ = _doctor(capsys, "--stack", "vllm-ascend-0.23.0", "--recipe", str(SEED002), "--json")
    rejected = json.loads(out)["recipe_rejected"]
    assert "swap_optimizer" in rejected and "gradient_checkpointing_kwargs" not in rejected


def test_doctor_on_cpu_says_a_cluster_recipe_needs_stack(capsys):
    from harness.config import hardware as hw

    if hw.detect().kind != "cpu":
        pytest.skip("the note is for a CPU machine judging a cluster recipe")
    code, out, _ = _doctor(capsys, "--json", "--", "trainer.device=npu", "trainer.nnodes=16")
    doc = json.loads(out)
    assert "pass --stack NAME" in doc["known_bugs"]["note"] and "trainer.nnodes=16" in doc["known_bugs"]["note"]
    # verl's Ascend nightly scripts set no trainer.device (verl sets npu on an Ascend host): one node of 8 devices
    code, out, _ = _doctor(capsys, "--json", "--", "trainer.n_gpus_per_node=8")
    assert "trainer.n_gpus_per_node=8" in json.loads(out)["known_bugs"]["note"]


def test_doctor_checks_this_machines_environment(monkeypatch):
    """The env rows of this machine's stack are judged against its environment (seeded: an empty one, so an
    exported PYTORCH_NPU_ALLOC_CONF=expandable_segments:True never hit); a named stack has no machine to read."""
    from harness.cli.doctor_cmd import known_bugs

    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    row = "vllm-ascend-camem-expandable-segments"
    assert row in {h["id"] for h in known_bugs(A3_STACK, None, installed=True)["hits"]}
    assert row not in {h["id"] for h in known_bugs(A3_STACK, None, installed=False)["hits"]}


def test_routed_experts_detector_reads_the_capture_order(tmp_path):
    """vllm-ascend #13268 / #13882: the capture after log2phy (physical ids) is found in the source; the fixed order,
    and a tag without routed_experts.py (v0.23.0 captures in fused_moe.py), are not."""
    from harness.config.installed import vllm_ascend_physical_routes_bug

    moe = tmp_path / "ops" / "fused_moe"
    moe.mkdir(parents=True)
    assert vllm_ascend_physical_routes_bug(tmp_path).present is False  # no routed_experts.py
    path = moe / "routed_experts.py"
    path.write_text("def _select_experts(self, x):\n    topk_ids = self.log2phy[topk_ids]\n"
                    "    self.capturer.capture(self.layer_id, topk_ids)\n")
    found = vllm_ascend_physical_routes_bug(tmp_path)
    assert found.present is True and "#13268" in found.detail
    path.write_text("def _select_experts(self, x):\n    self.capturer.capture(self.layer_id, topk_ids)\n"
                    "    topk_ids = self.log2phy[topk_ids]\n")
    assert vllm_ascend_physical_routes_bug(tmp_path).present is False
    # only _select_experts counts: a mention in another function or a comment does not flip it
    path.write_text("# topk_ids = self.log2phy[topk_ids]\ndef helper(self):\n    return self.log2phy[topk_ids]\n"
                    "def _select_experts(self, x):\n    self.capturer.capture(self.layer_id, topk_ids)\n")
    assert vllm_ascend_physical_routes_bug(tmp_path).present is False
