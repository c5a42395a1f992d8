"""The conventions users type without thinking (issue 33), each checked as users meet it: a clean pytest run prints
no PytestAssertRewriteWarning, and `make job` / `make test` exit with pytest's own code."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_a_clean_run_prints_no_assert_rewrite_warning():
    # the root conftest loads every fixtures/ module; one imported another before pytest marked it, on every run
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "tests/test_io.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "PytestAssertRewriteWarning" not in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_the_warning_check_fails_on_the_seeded_import_order(pytester):
    # seeded: the root conftest as it was (plugins imported in sorted order, one importing the next unmarked)
    pytester.makepyfile(**{"fix33/__init__.py": "", "fix33/a.py": "from fix33.b import VALUE\n",
                           "fix33/b.py": "VALUE = 1\n", "test_x.py": "def test_x():\n    assert True\n"})
    plugins = 'pytest_plugins = ["fix33.a", "fix33.b"]\n'
    pytester.makeconftest(plugins)
    seeded = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:ascend_rl_harness")
    assert "PytestAssertRewriteWarning" in seeded.stdout.str()
    pytester.makeconftest(textwrap.dedent('''
        import pytest
        pytest.register_assert_rewrite("fix33.a", "fix33.b")
    ''') + plugins)
    fixed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:ascend_rl_harness")
    assert fixed.ret == 0 and "PytestAssertRewriteWarning" not in fixed.stdout.str()
