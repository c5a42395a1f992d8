"""Fault injection for the reliability self-tests: the command line run as a user runs it (a subprocess, so a
signal, a full disk or a hang hits a real process), inside a private mount namespace with a full tmpfs or a
read-only bind mount (root only: skipped with the reason otherwise), plus the small inputs the cases share (a
suites tree, verl runs, a golden, report JSONs)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PASSING = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_ok(record_property):
        record_property("throughput", {"tps_per_card": 1.5})
''')


def env(**extra: str) -> dict[str, str]:
    """This checkout's harness first on the path; no variables of the outer pytest session (pytest-benchmark and
    xdist read them)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [base.get("PYTHONPATH")])])
    return {**base, **extra}


def cli_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", *map(str, argv)]


def cli(*argv, cwd, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    """`ascend-rl-harness ARGV` in a subprocess; a hang shows as TimeoutExpired, not as a stuck test session."""
    return subprocess.run(cli_argv(*argv), cwd=cwd, env=popen.pop("env", None) or env(), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, **popen)


def one_line_exit_2(proc: subprocess.CompletedProcess, *names: str) -> str:
    """The bad-input contract: exit 2, one line on stderr naming `names`, no traceback. Returns the line."""
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(err.splitlines()) == 1, \
        (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    for name in names:
        assert name in err, (name, err)
    return err


def needs_root_mounts() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a full tmpfs / read-only bind mount needs root and util-linux unshare (private mount namespace)")


def full_tmpfs(directory: Path) -> str:
    """Shell: a 1 MiB tmpfs at `directory`, then filled: every later write there fails with ENOSPC."""
    d = shlex.quote(str(directory))
    return f"mkdir -p {d} && mount -t tmpfs -o size=1m tmpfs {d}"


def fill(directory: Path) -> str:
    d = shlex.quote(str(directory))
    return f"(cat /dev/zero > {d}/.fill 2>/dev/null; true)"


def read_only(directory: Path) -> str:
    """Shell: `directory` bind-mounted onto itself read-only (EROFS for every write below it, root included)."""
    d = shlex.quote(str(directory))
    return f"mkdir -p {d} && mount --bind {d} {d} && mount -o remount,bind,ro {d}"


def in_mount_namespace(script: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a bash script in a private mount namespace (its mounts vanish with it; the session never sees them)."""
    needs_root_mounts()
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", "set -u\n" + script],
                          cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def record(name: str, results: Path, *argv) -> str:
    """Shell: run the CLI, keep its exit status, stdout and stderr in results/NAME.{rc,out,err}."""
    r = shlex.quote(str(results / name))
    return f"{shlex.join(cli_argv(*argv))} > {r}.out 2> {r}.err; echo $? > {r}.rc"


def recorded(name: str, results: Path) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(name, int((results / f"{name}.rc").read_text()),
                                       (results / f"{name}.out").read_text(), (results / f"{name}.err").read_text())


def suites_tree(root: Path, body: str = PASSING, name: str = "test_tree.py") -> Path:
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / name).write_text(body)
    return root


def write_runs(root: Path, n: int = 3, steps: int = 20) -> list[str]:
    """n verl FileLogger runs that align with each other (reward, step time, tokens, throughput)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = root / f"r{i}.jsonl"
        path.write_text("".join(json.dumps({"step": s, "data": {
            "critic/rewards/mean": 0.02 * s + 0.01 * i, "timing_s/step": 10.0 + i, "perf/total_num_tokens": 5000.0,
            "perf/throughput": 500.0 / (10.0 + i)}}) + "\n" for s in range(1, steps + 1)))
        paths.append(str(path))
    return paths


def report_set(out: Path) -> dict[str, str]:
    """The report set a report directory shows (name -> text), read through whatever links it uses."""
    return {p.name: p.read_text(errors="replace") for p in sorted(out.iterdir())
            if p.name in ("report.json", "report.html", "report.md", "junit.xml", "pytest.log") and p.exists()}


def assert_one_set(out: Path) -> dict:
    """The report files of `out` belong to one run: the page and the Markdown name the JSON's report, and the log
    counts the JSON's tests. Returns the JSON."""
    files = report_set(out)
    doc = json.loads(files["report.json"])
    assert doc["name"] in files["report.html"] and doc["name"] in files["report.md"], doc["name"]
    assert f'name="{doc["name"]}"' in files["junit.xml"], doc["name"]
    if "pytest.log" in files:
        assert f"{len(doc['tests'])} passed" in files["pytest.log"], files["pytest.log"][-500:]
    return doc


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout:.0f} s"
        time.sleep(0.05)
