"""A full disk, a read-only file system, a denied directory or a too-long name end in one line naming the path
and exit 2, with nothing half-written and the previous files intact; a read-only trend store still renders. Each
writing command runs for real inside a private mount namespace (a full tmpfs, a read-only bind mount; root only).
Writers that must not overwrite are atomic against each other."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from faults import (
    cli,
    cli_argv,
    env,
    fill,
    full_tmpfs,
    in_mount_namespace,
    one_line_exit_2,
    read_only,
    record,
    recorded,
    report_set,
    suites_tree,
    write_runs,
)

from fixtures.report import make_report
from harness.report.schema import write_report


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The inputs, made once per module (per xdist worker): a `baseline record` and a `run` (the earlier report set
    the fault cases put on the broken file system) are CLI children of ~5-10 s each, the same for every case."""
    root = tmp_path_factory.mktemp("inputs")
    runs = write_runs(root / "runs")
    made = cli("baseline", "record", *runs, "--out", root / "golden.json", cwd=root)
    assert made.returncode == 0, made.stderr
    for i in range(2):
        write_report(make_report(f"night-{i}", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0 + i),
                     root / "store" / f"night-{i}.json")
    suites_tree(root)
    first = cli("run", "--scale", "tiny", "--report-dir", root / "earlier-reports", cwd=root)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    return root


@pytest.fixture
def inputs(made, tmp_path):
    """Reference runs, a golden, a two-night store, a suites tree and an earlier run's report set (out of its
    relative links, copied as links), each case's own copy in its tmp_path, outside any mount."""
    shutil.copytree(made, tmp_path, symlinks=True, dirs_exist_ok=True)
    runs = [str(tmp_path / "runs" / Path(r).name) for r in sorted(os.listdir(made / "runs"))]
    return {"runs": runs, "golden": str(tmp_path / "golden.json"), "store": str(tmp_path / "store"),
            "root": tmp_path, "earlier": tmp_path / "earlier-reports"}


def _commands(inputs, target):
    """What each writing command writes into `target` (a directory on the broken file system)."""
    runs, golden, store = inputs["runs"], inputs["golden"], inputs["store"]
    return {
        "report": ["report", store, "-o", target / "pages"],
        "baseline-record": ["baseline", "record", *runs, "--out", target / "golden.json", "--force"],
        "compare-plot": ["compare", runs[0], golden, "--plot", target / "cmp.png"],
        "run": ["run", "--scale", "tiny", "--report-dir", target / "reports"],
        "run-history": ["run", "--scale", "tiny", "--report-dir", inputs["root"] / "ok", "--history",
                        target / "store"],
        "lab": ["lab", "--steps", "1", "--gbs", "1", "--n", "2", "--out", target / "lab"],
    }


FAULTS = {"ENOSPC": (full_tmpfs, "No space left on device"), "EROFS": (read_only, "Read-only file system")}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_writer_says_one_line_and_keeps_the_old_files(inputs, tmp_path, fault):
    # seeded by the old writers: OSError ENOSPC / EROFS tracebacks with exit 1 from report, baseline record,
    # compare --plot, lab --out, run and run --history
    mount, strerror = FAULTS[fault]
    target, results, before = tmp_path / "mnt", tmp_path / "results", tmp_path / "reports-before"
    results.mkdir()
    commands = _commands(inputs, target)
    q = lambda path: shlex.quote(str(path))  # noqa: E731
    script = [  # before the fault: an earlier run's report set and an earlier golden sit on the file system
        f"mkdir -p {q(target)} {q(before)}", mount(target) if fault == "ENOSPC" else "true",
        f"cp -a {q(inputs['earlier'])} {q(target / 'reports')}",
        f"cp {q(inputs['golden'])} {q(target / 'golden.json')}", f"cp -rL {q(target / 'reports')}/. {q(before)}",
        fill(target) if fault == "ENOSPC" else mount(target),
        *(record(name, results, *argv) for name, argv in commands.items()),
        # what the fault must not have touched, copied out before the namespace and its mounts go
        f"cp -rL {q(target / 'reports')} {q(results / 'reports-after')}",
        f"cmp -s {q(inputs['golden'])} {q(target / 'golden.json')} && touch {q(results / 'golden-intact')}"]
    done = in_mount_namespace("\n".join(script), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in commands:
        line = one_line_exit_2(recorded(name, results), str(target))
        assert strerror in line, (name, line)
    assert (results / "golden-intact").exists()
    assert report_set(results / "reports-after") == report_set(before)


def test_a_read_only_store_with_a_corrupt_entry_renders_without_quarantine(inputs, tmp_path):
    # seeded by the old load_store: the quarantine rename failed with EROFS, so the store could not be rendered
    store = tmp_path / "store"
    (store / "broken.json").write_text("{\"schema\": \"ascend-rl-harness/report\"")
    results = tmp_path / "results"
    results.mkdir()
    done = in_mount_namespace(read_only(store) + " && " + record("report", results, "report", store, "-o",
                                                                  tmp_path / "pages"), tmp_path)
    assert done.returncode == 0, done.stderr
    proc = recorded("report", results)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken.json" in proc.stdout + proc.stderr and "read-only" in proc.stdout + proc.stderr
    assert (store / "broken.json").is_file() and not list(store.glob("*.corrupt"))
    assert (tmp_path / "pages" / "trend.html").is_file()


def test_a_denied_directory_is_one_line(inputs, tmp_path):
    # EACCES: root reads and writes everywhere, so the command runs as nobody
    if os.geteuid() != 0:
        pytest.skip("needs root to run the command as another user (setpriv)")
    denied = tmp_path / "denied"
    denied.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    for p in (tmp_path / "runs", *map(lambda r: tmp_path / "runs" / r, os.listdir(tmp_path / "runs"))):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cli_argv(
        "baseline", "record", *inputs["runs"], "--out", denied / "golden.json")], cwd=tmp_path, env=env(),
        capture_output=True, text=True, timeout=120)
    if "Permission denied" in proc.stderr and "harness" not in proc.stderr:
        pytest.skip(f"nobody cannot read this checkout: {proc.stderr.strip()[:200]}")
    assert "Permission denied" in one_line_exit_2(proc, str(denied))


def test_a_too_long_file_name_is_one_line(inputs, tmp_path):
    proc = cli("baseline", "record", *inputs["runs"], "--out", tmp_path / ("g" * 300 + ".json"), cwd=tmp_path)
    assert "File name too long" in one_line_exit_2(proc, "ggg")
    proc = cli("report", inputs["store"], "-o", tmp_path / ("o" * 300), cwd=tmp_path)
    assert "File name too long" in one_line_exit_2(proc, "ooo")


def test_two_baseline_records_without_force_never_both_write(inputs, tmp_path):
    # seeded by the old check-then-write: both exited 0 and the first golden was silently overwritten (1 try in 6)
    for attempt in range(3):
        out = tmp_path / f"same-{attempt}.json"
        procs = [subprocess.Popen(cli_argv("baseline", "record", *inputs["runs"], "--out", out), cwd=tmp_path,
                                  env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        ended = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        codes = sorted(code for code, _ in ended)
        assert codes == [0, 2], ended
        loser = next(err for code, err in ended if code == 2)
        assert "already exists" in loser and len(loser.strip().splitlines()) == 1, loser
        assert json.loads(out.read_text())["schema"] == "ascend-rl-harness/baseline"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".same-{attempt}")]


def test_exclusive_writes_race_in_process(tmp_path):
    # the primitive itself: of many writers of one new file, exactly one wins and the file is whole
    from harness.errors import BadInput
    from harness.io import write_atomic

    target, wins, refused = tmp_path / "golden.json", [], []
    barrier = threading.Barrier(8)

    def writer(i):
        barrier.wait()
        try:
            write_atomic(target, f"writer {i}\n" * 1000, overwrite=False)
            wins.append(i)
        except BadInput as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(refused) == 7 and all("already exists" in r for r in refused)
    assert target.read_text() == f"writer {wins[0]}\n" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["golden.json"]
