"""Self-tests of the harness. `pytester` runs the plugin in throw-away pytest sessions (tests/test_plugin.py)."""

import sys

import pytest

from harness.config import hardware as hw

pytest_plugins = ["pytester"]


@pytest.fixture
def broken_torch_npu(tmp_path, monkeypatch):
    """A torch_npu that fails like one installed without CANN (its native libs cannot load)."""
    site = tmp_path / "site"
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text(
        "raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n")
    monkeypatch.syspath_prepend(str(site))
    hw.detect.cache_clear()
    yield site
    sys.modules.pop("torch_npu", None)
    hw.detect.cache_clear()
