"""--run-dir and --baseline are checked when pytest starts: a missing path or a directory without verl
logs is a usage error (exit 4, one line naming the option), not a FAIL in every test that reads it."""
from __future__ import annotations

import pytest

SUITE = "def test_reads_nothing():\n    pass\n"


@pytest.mark.parametrize("option, make", [
    ("--run-dir", lambda root: root / "no-such-run"),
    ("--run-dir", lambda root: (root / "empty").mkdir() or root / "empty"),
    ("--run-dir", lambda root: (root / "summary.txt").write_text("perf/throughput: 48.0\n") and root / "summary.txt"),
    ("--baseline", lambda root: root / "missing-golden.json"),
])
def test_a_bad_input_path_is_a_usage_error(pytester: pytest.Pytester, option, make):
    pytester.makepyfile(test_suite=SUITE)
    path = make(pytester.path)
    result = pytester.runpytest(option, str(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and option in errors[0] and str(path) in errors[0], result.errlines


def test_good_input_paths_run(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)
    run = pytester.path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {"timing_s/step": 1.0}}\n')
    (pytester.path / "summary.txt").write_text("perf/throughput: 48.0\n")
    result = pytester.runpytest("--run-dir", str(run), "--baseline", str(pytester.path / "summary.txt"))
    assert result.ret == pytest.ExitCode.OK
