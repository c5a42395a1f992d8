"""Expected failures say what is expected (harness.markers.upstream_failure): the exception type AND its message.
On the recorded AMX host the weight sync raised RuntimeError where the strict xfail expected the stale-weights
AssertionError, and the bare xfail of the plain `vllm` kind would have read any crash as the expected failure. In
throw-away sessions (pytester): the expected failure is accepted, a different message or type fails, a pass fails
(strict), and a project test whose xfail drops its `raises` or message is refused at collection."""
from __future__ import annotations

import pytest

import harness.plugin

SUITE = """
import pytest
from harness.markers import upstream_failure

EXPECTED = upstream_failure(RuntimeError, r"size of tensor a \\(0\\) must match", reason="AMX_MLA empties kv_b_proj")

@EXPECTED
def test_expected():
    raise RuntimeError("The size of tensor a (0) must match the size of tensor b (512) at non-singleton dimension 1")

@EXPECTED
def test_other_message():
    raise RuntimeError("CUDA out of memory")

@EXPECTED
def test_other_type():
    raise AssertionError("The size of tensor a (0) must match")

@EXPECTED
def test_passes():
    pass

@upstream_failure(RuntimeError, "never", reason="not on this platform", condition=False)
def test_not_expected_here():
    pass
"""


def test_an_expected_failure_is_its_type_and_message(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-rxXf", "-p", "no:cacheprovider")
    result.assert_outcomes(xfailed=1, failed=3, passed=1)
    out = result.stdout.str()
    assert "XFAIL test_suite.py::test_expected" in out
    assert ("expected failure not seen: RuntimeError matching /size of tensor a \\(0\\) must match/ (AMX_MLA empties "
            "kv_b_proj); got RuntimeError: CUDA out of memory") in out
    assert "FAILED test_suite.py::test_other_type" in out and "[XPASS(strict)]" in out


@pytest.mark.parametrize("mark", ["@pytest.mark.xfail(strict=True)",
                                  "@pytest.mark.xfail(strict=True, raises=RuntimeError)",
                                  "@pytest.mark.xfail(reason='flaky')"])
def test_a_project_xfail_without_its_failure_is_refused(pytester: pytest.Pytester, monkeypatch, mark):
    """The seeded bug: a strict xfail whose `raises` (or message) was dropped. In the project's own test
    directories it stops the session at collection, naming the test and the marker to use."""
    monkeypatch.setattr(harness.plugin, "PROJECT_DIRS", (pytester.path,))
    pytester.makepyfile(test_suite=f"import pytest\n\n{mark}\ndef test_crashes():\n    raise RuntimeError('x')\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*1 xfail(s) without the failure they expect (test_suite.py::test_crashes)*"
                                 "upstream_failure(raises=..., match=..., reason=...)*"])


def test_outside_the_project_a_plain_xfail_is_the_users_business(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite="import pytest\n\n@pytest.mark.xfail(strict=True)\ndef test_x():\n    assert 0\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(xfailed=1)


def test_a_bad_expectation_fails_where_it_is_written():
    from harness.markers import upstream_failure

    with pytest.raises(TypeError, match="an exception type is expected"):
        upstream_failure("RuntimeError", "x", reason="y")
    with pytest.raises(Exception, match="unterminated|missing"):
        upstream_failure(RuntimeError, "(", reason="y")
