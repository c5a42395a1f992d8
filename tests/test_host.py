"""The host fingerprint and the HARNESS_CPU_ISA switch (harness.config.host): what selects a CPU result's kernels is
recorded, two fingerprints agree only when their kernels do, and the switch makes one machine behave as an
AVX2-only host -- ATen / oneDNN / MKL capped, torch.cpu's ISA probes (which vLLM CPU asks) answering False -- in
the pytest process and in the processes it starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.config import host

PROBE = """
import json, torch
from harness.config import host
host.apply_isa_mask()
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "amx": host.has_amx(),
                  "avx512": torch.cpu._is_avx512_supported(), "amx_probe": torch.cpu._is_amx_tile_supported(),
                  "fingerprint": host.fingerprint()}))
"""


def _probe(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (host.HIDE_ENV, *host.KERNEL_ENV)}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_avx2_mask_hides_avx512_and_amx_from_torch_and_vllm_probes():
    plain, masked = _probe(), _probe(**{host.HIDE_ENV: "avx2"})
    assert masked["capability"] == "AVX2" and not masked["avx512"] and not masked["amx_probe"] and not masked["amx"]
    fp = masked["fingerprint"]
    assert fp["mask"] == "avx2" and set(fp["isa"]) <= {"avx2", "fma"}
    assert fp["env"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    if plain["capability"] != "AVX2":  # a host with AVX-512: the mask changed which kernels run, and says so
        assert not host.same_kernels(plain["fingerprint"], fp)
        assert "aten_capability" in host.differences(fp, plain["fingerprint"])


def test_the_mask_is_refused_once_torch_picked_its_kernels(monkeypatch):
    """ATEN_CPU_CAPABILITY is read when torch first dispatches: a mask set later cannot take effect and says so."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        pytest.skip("this host runs AVX2 kernels anyway: nothing to refuse")
    monkeypatch.setenv(host.HIDE_ENV, "avx2")
    before = dict(os.environ)
    with pytest.raises(host.HostMaskError, match="export HARNESS_CPU_ISA=avx2 before starting"):
        host.apply_isa_mask()
    assert dict(os.environ) == before  # nothing half-applied


def test_an_unknown_mask_is_one_line(monkeypatch):
    monkeypatch.setenv(host.HIDE_ENV, "sse2")
    with pytest.raises(host.HostMaskError, match="known masks are avx2"):
        host.mask()
    result = subprocess.run([sys.executable, "-m", "harness.cli", "scales"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, host.HIDE_ENV: "sse2"})
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "HARNESS_CPU_ISA" in result.stderr


def test_fingerprints_agree_only_on_every_kernel_field():
    here = host.fingerprint()
    assert host.same_kernels(here, dict(here))
    assert not host.same_kernels(here, None) and not host.same_kernels(None, None)
    amx = {**here, "isa": sorted({*here["isa"], "amx_tile"} - {"avx2"})}
    assert not host.same_kernels(here, amx)
    assert "+amx_tile" in host.differences(amx, here) and "-amx_tile" in host.differences(here, amx)
    capped = {**here, "env": {"MKL_CBWR": "AVX2"}}
    assert not host.same_kernels(here, capped) and "env" in host.differences(here, capped)
    assert host.same_kernels(here, {**here, "mask": "whatever"})  # the mask shows in isa/env, not by itself
    assert host.differences(here, None) == "host fingerprint unknown for the reference"


def test_the_kernel_env_travels_to_jobs(monkeypatch):
    """A Ray job's processes get HARNESS_CPU_ISA and the caps (harness.launch.tiny_verl puts them in its env)."""
    from harness.config.scales import get_scale
    from harness.launch.jobs import job_for_scale

    monkeypatch.setenv(host.HIDE_ENV, "avx2")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    env = job_for_scale(get_scale("tiny"), "/tmp/x", seed=0).env
    assert env[host.HIDE_ENV] == "avx2" and env["MKL_CBWR"] == "AVX2"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == host.SITE_DIR


def test_a_fresh_interpreter_of_a_job_is_masked_before_any_harness_code_runs():
    """vLLM's EngineCore and workers are spawned interpreters that import vLLM first: the job's PYTHONPATH leads
    them through isa_site/sitecustomize.py (measured: without it vLLM's worker loaded _C.abi3, the AVX-512 BF16
    build, under HARNESS_CPU_ISA=avx2)."""
    probe = ("import torch; print(torch.backends.cpu.get_cpu_capability(), torch.cpu._is_avx512_supported(), "
             "torch.cpu._is_amx_tile_supported())")
    clean = {k: v for k, v in os.environ.items() if k not in (host.HIDE_ENV, *host.KERNEL_ENV, "PYTHONPATH")}
    env = {**clean, host.HIDE_ENV: "avx2", "PYTHONPATH": host.SITE_DIR}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert out == ["AVX2", "False", "False"]


# The cases whose outcome the host decides: bit-exactness against a golden, the lab's determinism, the backend
# choice, and a real vLLM CPU engine on the AVX2 kernel library.
DECISIVE = ("tests/test_curve_calibration.py::test_the_lab_is_bit_for_bit_deterministic_on_one_host",
            "tests/test_curve_calibration.py::test_a_golden_seed_reproduces_exactly_and_a_fault_does_not",
            "tests/test_platforms.py",
            "suites/precision/test_mla_softmax_scale.py::test_tiny_engine_scale_is_closed_form")


def test_the_decisive_cases_pass_with_avx512_and_amx_hidden():
    """The lane that proves the other kind of host on this one: the decisive cases in a pytest session that starts
    with HARNESS_CPU_ISA=avx2 (ATen / oneDNN / MKL capped, vLLM CPU on _C_AVX2, the backend chosen as without
    AMX). On an AVX2-only host it is the same session as the plain one."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    clean = {k: v for k, v in os.environ.items() if k not in (host.HIDE_ENV, *host.KERNEL_ENV, "PYTEST_XDIST_WORKER")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *DECISIVE], cwd=root, env={**clean, host.HIDE_ENV: "avx2"}, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
