"""Interrupted runs lose nothing and mix nothing: SIGINT exits 130 and SIGTERM 143, like any tool a signal
stopped; the previous report set (report.json, .html, .md and pytest.log) stays whole unless the new one is
complete, because the set is swapped in with one rename; an interrupted test is never counted as passed; the
background tiny verl launcher and its Ray cluster are stopped on every exit path. Each case is a real process
and a real signal, sent at the moment the case names."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from faults import ROOT, assert_one_set, cli, cli_argv, env, report_set, suites_tree, wait_for

SECOND = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_second():
        pass
''')


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A tree whose first run (one passing test) left a complete report set in out/: one real `run` per module
    (per xdist worker), copied into each case's tree (a `run`, ~10 s here, saved per case)."""
    root = suites_tree(tmp_path_factory.mktemp("first-run"))
    first = cli("run", "--scale", "tiny", "--report-dir", "out", cwd=root)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    return root


@pytest.fixture
def old_set(first_run, tmp_path):
    """The first run's tree in this case's tmp_path, its report set as `run` left it (out/'s relative links copied
    as links, its lock and pytest cache too): the previous set the case's run must keep or replace."""
    shutil.copytree(first_run, tmp_path, symlinks=True, dirs_exist_ok=True)
    return report_set(tmp_path / "out")


def _sigint_as_at_a_terminal() -> None:
    """The child's SIGINT back to its default: a shell starts a background job (`scripts/test &`, nohup, some CI
    step runners) with SIGINT ignored, every child inherits that and Python then never raises KeyboardInterrupt --
    the SIGINT cases failed (exit 0, the run went on to the end) only because the suite itself was started so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(tmp_path, marker, sig, *argv) -> subprocess.CompletedProcess:
    """Start the command, send `sig` once `marker` exists, return how it ended."""
    proc = subprocess.Popen(cli_argv(*argv), cwd=tmp_path, env=env(MARKER=str(marker)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=_sigint_as_at_a_terminal)
    try:
        wait_for(marker, 120)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _signal_line(proc, code: int) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == code and "Traceback" not in proc.stderr and len(err.splitlines()) == 1, \
        (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "interrupted" in err, err


SLOW_COLLECTION = textwrap.dedent('''
    import os, time
    from pathlib import Path

    Path(os.environ["MARKER"]).write_text("collecting")
    time.sleep(60)
''')


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_collection_keeps_the_previous_report(tmp_path, old_set, sig, code):
    # seeded by the old runner: SIGINT during collection replaced the report with a 0-test one and exited 1
    before = old_set
    (tmp_path / "suites" / "test_slow_collection.py").write_text(SLOW_COLLECTION)
    proc = _interrupt(tmp_path, tmp_path / "collecting", sig, "run", "--scale", "tiny", "--report-dir", "out")
    _signal_line(proc, code)
    assert report_set(tmp_path / "out") == before
    assert not list((tmp_path / "out").glob(".pytest.log*"))


HOLD_AT_UNCONFIGURE = textwrap.dedent('''
    import os, time
    from pathlib import Path

    def pytest_unconfigure(config):
        if os.environ.get("MARKER"):
            Path(os.environ["MARKER"]).write_text("report written")
            time.sleep(60)
''')


def test_a_signal_after_the_report_is_written_leaves_one_whole_set(tmp_path, old_set):
    # seeded by the old runner: a 40-line traceback, the new report beside the old pytest.log and a
    # .pytest.log.new left behind
    (tmp_path / "suites" / "test_second.py").write_text(SECOND)
    (tmp_path / "suites" / "conftest.py").write_text(HOLD_AT_UNCONFIGURE)
    proc = _interrupt(tmp_path, tmp_path / "written", signal.SIGINT, "run", "--scale", "tiny", "--report-dir", "out")
    _signal_line(proc, 130)
    assert_one_set(tmp_path / "out")
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".pytest.log")]


SLOW_FOURTH = textwrap.dedent('''
    import os, time
    from pathlib import Path

    import pytest

    @pytest.mark.tiny
    @pytest.mark.parametrize("i", range(3))
    def test_fast(i):
        pass

    @pytest.mark.tiny
    def test_slow():
        Path(os.environ["MARKER"]).write_text("running")
        time.sleep(60)
''')


@pytest.mark.parametrize("runner", ["run", "pytest"])
def test_an_interrupted_test_is_never_counted_passed(tmp_path, old_set, runner):
    # seeded by the old collector: the test stopped mid-way was recorded passed (4 passed where pytest said 3)
    before = old_set
    (tmp_path / "suites" / "test_tree.py").write_text(SLOW_FOURTH)
    marker = tmp_path / "running"
    if runner == "run":
        proc = _interrupt(tmp_path, marker, signal.SIGINT, "run", "--scale", "tiny", "--report-dir", "out")
        _signal_line(proc, 130)
    else:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--scale", "tiny",
                                 "--report-dir", "out", "suites"], cwd=tmp_path, env=env(MARKER=str(marker)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_sigint_as_at_a_terminal)
        wait_for(marker)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    # the interrupted session's report is incomplete: the previous set stays, and no report counts test_slow passed
    assert report_set(tmp_path / "out") == before
    doc = json.loads(before["report.json"])
    assert [t["outcome"] for t in doc["tests"]] == ["passed"]


def test_the_collector_counts_only_tests_whose_call_ran(tmp_path):
    # an interrupt between setup and call leaves only a passed setup report: that test has no outcome yet
    from harness.report.collect import ReportCollector

    collector = ReportCollector.__new__(ReportCollector)  # no session: only the per-test bookkeeping
    collector.tests, collector.root = {}, str(tmp_path)
    for nodeid, phases in (("t.py::done", ("setup", "call", "teardown")), ("t.py::stopped", ("setup",)),
                           ("t.py::skipped", ("setup",))):
        for when in phases:
            outcome = "skipped" if nodeid.endswith("skipped") else "passed"
            longrepr = ("t.py", 1, "Skipped: no npu") if outcome == "skipped" else None
            collector.pytest_runtest_logreport(pytest.TestReport(nodeid, ("t.py", 1, nodeid), {}, outcome, longrepr,
                                                                 when))
    assert collector.outcomes() == {"t.py::done": "passed", "t.py::skipped": "skipped"}


KILL_DRIVER = textwrap.dedent('''
    """Fork one `run` per N and SIGKILL the child at its N-th rename or link in the report directory; the parent
    reads the set after each kill. Ends when a child runs through without meeting its N-th rename."""
    import json, os, signal, sys
    from pathlib import Path

    import torch  # noqa: F401
    import harness.plugin  # noqa: F401
    from harness.cli import main

    # torch (the plugin's hardware probe) and the plugin are imported once, here: each fork inherits them instead of
    # importing them again (48.6 -> 25.4 s for the 7 forks on this host); the renames under test are the publisher's
    out = Path("out").resolve()
    seen = []
    for n in range(1, 40):
        pid = os.fork()
        if pid == 0:
            calls = [0]
            def fatal(original):
                def wrapper(src, dst, *a, **k):
                    if str(Path(dst).resolve(strict=False)).startswith(str(out)):
                        calls[0] += 1
                        if calls[0] == n:
                            os.kill(os.getpid(), signal.SIGKILL)
                    return original(src, dst, *a, **k)
                return wrapper
            os.replace, os.rename, os.link, os.symlink = map(fatal, (os.replace, os.rename, os.link, os.symlink))
            sys.stdout = sys.stderr = open(os.devnull, "w")
            os._exit(main(["run", "--scale", "tiny", "--report-dir", "out"]))
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        files = {p.name: p.read_text(errors="replace") for p in sorted(out.iterdir())
                 if p.name in ("report.json", "report.html", "report.md", "junit.xml", "pytest.log") and p.exists()}
        seen.append({"n": n, "killed": killed, "files": files})
        if not killed:
            break
    print(json.dumps(seen))
''')


def test_a_kill_at_any_rename_leaves_the_old_set_or_the_new_one(tmp_path, old_set):
    # seeded by the old publisher: SIGKILL between the renames of report.html and report.json left a new page
    # beside the old JSON and Markdown
    before = old_set
    (tmp_path / "suites" / "test_second.py").write_text(SECOND)
    proc = subprocess.run([sys.executable, "-c", KILL_DRIVER], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    assert seen[-1]["killed"] is False and len(seen) > 1, [s["n"] for s in seen]
    for case in seen:
        files = case["files"]
        if files == before:
            continue  # the kill came before the swap: the previous set, whole
        doc = json.loads(files["report.json"])  # else the new set, whole: page, Markdown and log of this report
        assert doc["name"] in files["report.html"] and doc["name"] in files["report.md"], case["n"]
        assert f'name="{doc["name"]}"' in files["junit.xml"], case["n"]
        assert len(doc["tests"]) == 2 and "2 passed" in files["pytest.log"], case["n"]
    assert json.loads(seen[-1]["files"]["report.json"])["name"] != json.loads(before["report.json"])["name"]


TINY_VERL = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_needs_the_verl_run(tiny_verl_run):
        pass
''')


def _marked(mark: str) -> list[str]:
    """Processes whose environment carries `mark` (the launcher, unshare, the namespace's shell, Ray's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read()
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark.encode() in environ:
            found.append(f"{pid} {cmdline[:100]}")
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the background tiny verl launcher needs root (unshare --net)")
def test_sigterm_while_the_tiny_verl_launch_starts_stops_the_launcher_and_its_cluster(tmp_path):
    # seeded by the old fixture: pytest died on SIGTERM and left the launcher and 10 Ray processes
    # reparented to PID 1. Stopped early: the launcher's process group and namespace are up, verl is not trained.
    (tmp_path / "conftest.py").write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                                          "pytest_plugins = ['fixtures.dapo']\n")
    (tmp_path / "test_verl_tree.py").write_text(TINY_VERL)
    mark = f"HARNESS_TEST_MARK_{uuid.uuid4().hex}"
    base = tmp_path / "base"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--scale", "tiny",
                             "--basetemp", str(base), "test_verl_tree.py"], cwd=tmp_path, env=env(**{mark: "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(base / "tiny-verl-s1234" / "pid", 120)
        time.sleep(3.0)  # the launcher is past its start: unshare, the namespace's shell, the tiny job's setup
        assert _marked(mark), "the launcher did not start"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, out[-2000:]
    deadline = time.monotonic() + 30
    while (left := [p for p in _marked(mark) if not p.startswith(f"{proc.pid} ")]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def test_the_launcher_is_stopped_at_interpreter_exit(tmp_path):
    # the atexit path: a session that ends without pytest_sessionfinish (an internal error, os-level exit of the
    # interpreter through sys.exit in a plugin) still stops the launcher's process group
    script = textwrap.dedent(f'''
        import subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from fixtures.dapo import TinyVerlLaunch

        class Sleeper(TinyVerlLaunch):  # a launcher that only waits: the group, not verl, is under test
            def argv(self):
                return [sys.executable, "-c", "import time; time.sleep(120)"]

        Sleeper(Path({str(tmp_path / "home")!r})).start()
        print(Path({str(tmp_path / "home" / "pid")!r}).read_text(), flush=True)
        sys.exit(0)
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    pgid = int(proc.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"the launcher's process group {pgid} outlived the interpreter")
