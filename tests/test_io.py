"""Self-tests of harness.io's writers (nothing lost): atomic writes keep the umask's mode, clean the
temporaries of killed writers, and a directory lock refuses a second writer with one line."""
from __future__ import annotations

import os
import time

import pytest

from fixtures.report import hold_lock as hold
from harness.errors import BadInput
from harness.io import STALE_TMP_S, atomic_target, exclusive, write_atomic


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_keep_the_umask_mode(tmp_path, umask, mode):
    # mkstemp creates 0600 whatever the umask: shared reports were unreadable to the team
    old = os.umask(umask)
    try:
        path = write_atomic(tmp_path / "report.json", "{}")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    # atomic_target serves writers that take a file name (replay's DataProto and safetensors dumps)
    target = tmp_path / "gen_batch.dp"
    target.write_text("step 3")
    with pytest.raises(OSError), atomic_target(target) as tmp:
        tmp.write_text("half a batch")
        raise OSError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["gen_batch.dp"] and target.read_text() == "step 3"
    with atomic_target(target) as tmp:
        tmp.write_text("step 4")
    assert [p.name for p in tmp_path.iterdir()] == ["gen_batch.dp"] and target.read_text() == "step 4"


def test_stale_temporaries_of_killed_writers_are_cleaned(tmp_path):
    # of this file and of another (a trend store's keys differ every time); a user's own hidden file stays
    stale, other, fresh, mine = (tmp_path / n for n in (".report.json.abc12345.tmp", ".night-1.json.zz_99xyz.tmp",
                                                        ".report.json.def45678.tmp", ".notes.tmp"))
    old = time.time() - STALE_TMP_S - 60
    for tmp in (stale, other, fresh, mine):
        tmp.write_text("half a report")
        if tmp is not fresh:
            os.utime(tmp, (old, old))
    write_atomic(tmp_path / "report.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # a live writer's temporary is left alone
        ".notes.tmp", ".report.json.def45678.tmp", "report.json"]


def test_a_locked_directory_refuses_a_second_writer(tmp_path):
    holder = hold(tmp_path / "out")
    try:
        with pytest.raises(BadInput, match=rf"out: the report directory is in use by pid {holder.pid}"):
            with exclusive(tmp_path / "out", "the report directory"):
                pass
    finally:
        holder.communicate("")
    with exclusive(tmp_path / "out", "the report directory"):  # released when the holder is done
        with exclusive(tmp_path / "out", "the report directory"):  # and re-entrant within one process
            pass



def test_the_declared_filelock_never_follows_a_planted_link():
    # filelock before 3.20.1 opened its lock file with O_TRUNC through a symbolic link (CVE-2025-68146): a range
    # admitting it lets `pip install` into a team's image keep a filelock that truncates what a planted .lock in
    # /tmp points at (the machine lock; as root, /etc/passwd)
    from importlib.metadata import version
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    doc = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    (req,) = [r for r in map(Requirement, doc["project"]["dependencies"]) if r.name == "filelock"]
    assert not req.specifier.contains("3.20.0") and req.specifier.contains(version("filelock")), req
