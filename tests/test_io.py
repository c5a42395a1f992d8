"""Self-tests of harness.io's writers (issue 16, nothing lost): atomic writes keep the umask's mode, clean the
temporaries of killed writers, and a directory lock refuses a second writer with one line."""
from __future__ import annotations

import os
import time

import pytest

from harness.errors import BadInput
from harness.io import STALE_TMP_S, exclusive, write_atomic


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_keep_the_umask_mode(tmp_path, umask, mode):
    # mkstemp creates 0600 whatever the umask: shared reports were unreadable to the team
    old = os.umask(umask)
    try:
        path = write_atomic(tmp_path / "report.json", "{}")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode


def test_stale_temporaries_of_killed_writers_are_cleaned(tmp_path):
    stale, fresh = tmp_path / ".report.json.abc123.tmp", tmp_path / ".report.json.def456.tmp"
    for tmp in (stale, fresh):
        tmp.write_text("half a report")
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    write_atomic(tmp_path / "report.json", "{}")
    assert not stale.exists() and fresh.exists()  # a live writer's temporary is left alone
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.json.def456.tmp", "report.json"]


def test_a_locked_directory_refuses_a_second_writer(tmp_path):
    with exclusive(tmp_path / "out", "the report directory"):
        with pytest.raises(BadInput, match=rf"out: the report directory is in use by pid {os.getpid()}"):
            with exclusive(tmp_path / "out", "the report directory"):
                pass
    with exclusive(tmp_path / "out", "the report directory"):  # released when the holder is done
        pass
