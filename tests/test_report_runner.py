"""Self-test of the main job's runner (`ascend-rl-harness run`) on a throw-away suites/ tree: the exit
code follows the verdicts, the report (JSON + HTML + Markdown) is written, the verdict table names
the failing test."""
from __future__ import annotations

import json
import textwrap

from harness.cli import main

PASSING = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_ok(record_property):
        record_property("throughput", {"tps_per_card": 1.5})

    @pytest.mark.layer
    def test_other_tier_is_not_run():
        raise AssertionError("deselected by --scale tiny")
''')
FAILING = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_broken():
        assert 1 == 2, "seeded failure"

    @pytest.mark.tiny
    @pytest.mark.parametrize("x", ["a-1"])
    def test_param(x):
        pass
''')


def _tree(root, failing: bool):
    # distinct module names per tree: the runner's pytest runs in this process, where modules stay imported
    (root / "suites").mkdir()
    (root / "suites" / f"test_ok_{failing}.py").write_text(PASSING)
    if failing:
        (root / "suites" / "test_failing.py").write_text(FAILING)


def test_run_exit_0_and_report_when_all_pass(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, failing=False)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scale", "tiny", "--report-dir", "out"]) == 0
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [t["outcome"] for t in doc["tests"]] == ["passed"] and doc["scale"] == "tiny"
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "report.md").is_file()
    assert "PASS" in capsys.readouterr().out


def test_run_exit_1_names_the_failure(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, failing=True)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scale", "tiny", "--report-dir", "out"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "test_broken" in out and "seeded failure" in out
    assert "test_param[a-1]" in out  # parametrized ids survive rich markup
    assert "report.html" in out


def test_run_bad_scale_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scale", "nope", "--report-dir", "out"]) == 2


def test_a_suite_that_fails_to_import_is_an_error_verdict(tmp_path, monkeypatch, capsys):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_unimportable.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scale", "tiny", "--report-dir", "out"]) == 1
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(t["outcome"], "no_such_module_anywhere" in t["reason"]) for t in doc["tests"]] == [("error", True)]


def test_run_with_xdist_workers(tmp_path, monkeypatch):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_xdist_tree.py").write_text(PASSING + FAILING.replace("import pytest\n", ""))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scale", "tiny", "--report-dir", "out", "--workers", "2"]) == 1
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in doc["tests"]}
    assert outcomes == {"test_ok": "passed", "test_broken": "failed", "test_param[a-1]": "passed"}
    assert doc["tests"][0]["properties"] or doc["tests"][1]["properties"]  # record_property crossed from the worker


def test_run_history_stores_reports_and_writes_the_trend(tmp_path, monkeypatch):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_history_tree.py").write_text(PASSING)
    monkeypatch.chdir(tmp_path)
    for night in ("n1", "n2"):
        assert main(["run", "--scale", "tiny", "--report-dir", night, "--history", "store"]) == 0
    assert len(list((tmp_path / "store").glob("*.json"))) >= 1  # names carry a timestamp (1 s resolution)
    assert (tmp_path / "n2" / "trend.html").is_file() and "no regression" in (tmp_path / "n2" / "trend.md").read_text()
