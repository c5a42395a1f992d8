"""The host fingerprint and the HARNESS_CPU_ISA switch (harness.config.host): what selects a CPU result's kernels is
recorded, two fingerprints agree only when their kernels do, and the switch makes one machine behave as an
AVX2-only host -- ATen / oneDNN / MKL capped, torch.cpu's ISA probes (which vLLM CPU asks) answering False -- in
the pytest process and in the processes it starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import host
from harness.errors import BadInput

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
    """ATEN_CPU_CAPABILITY is read when torch first dispatches: a mask set later cannot take effect and says so --
    on a host whose torch runs more than AVX2; on an AVX2-only host there is nothing to refuse and it takes effect.
    (The decision for every kind of host: test_host_decisions_on_recorded_hosts.)"""
    import torch

    monkeypatch.setenv(host.HIDE_ENV, "avx2")
    for key in host.KERNEL_ENV:  # set, then deleted: recorded, so the caps apply_isa_mask exports are undone after
        monkeypatch.setenv(key, "")  # the test (they leaked into the session, and the masked-session test below
        monkeypatch.delenv(key)  # then ran on a host with nothing to hide, caps seemingly set)
    before = dict(os.environ)
    if host.mask_refusal("avx2", torch.backends.cpu.get_cpu_capability()) is None:
        assert host.apply_isa_mask() == "avx2" and os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
        return
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


# ---- the host as data: every CPU-dependent decision on recorded hosts, whatever this machine is ------------------
# tests/hosts/*.json: the AMX Xeon whose failures ../shared/hosts/README.md records, an AVX2-only EPYC and an
# AVX-512 Xeon without AMX. A test that derived "another host" from this one (adding amx_tile to its ISA list) was
# only right on a host without AMX.
HOSTS_DIR = Path(__file__).resolve().parent / "hosts"
RECORDED = {p.stem: json.loads(p.read_text()) for p in sorted(HOSTS_DIR.glob("*.json"))}
KINDS = {"amx-xeon": "amx", "avx512-xeon": "avx512", "avx2-epyc": "avx2"}


def recorded(name: str) -> host.Host:
    return host.Host.recorded(RECORDED[name]["fingerprint"], name)


@pytest.fixture
def unmasked(monkeypatch):
    for key in (host.HIDE_ENV, *host.KERNEL_ENV):
        monkeypatch.delenv(key, raising=False)


def test_the_recorded_hosts_cover_the_three_kinds():
    assert set(RECORDED) == set(KINDS)
    for name, doc in RECORDED.items():
        assert doc["source"] and doc["fingerprint"]["mask"] is None, name


@pytest.mark.parametrize("name", sorted(KINDS))
def test_host_decisions_on_recorded_hosts(name, unmasked):
    """Fingerprint, backend choice, mask refusal and the AMX expectation, decided from the host's data."""
    from harness.config.known_bugs import host_has_amx
    from harness.config.platforms import AMX_MLA_WEIGHT_SYNC, amx_weight_sync_case, attention_backend

    on, kind = recorded(name), KINDS[name]
    fp = host.fingerprint(on)
    assert fp == RECORDED[name]["fingerprint"]  # the fingerprint logic reproduces what that host recorded
    amx = host.has_amx(on)
    assert amx is (kind == "amx") and host_has_amx(on) is amx
    default = attention_backend("cpu", "default", amx=amx)
    assert (default.backend, default.dtype) == (("AMX_MLA", "bfloat16") if kind == "amx" else ("CPU_MLA", "float32"))
    assert attention_backend("cpu", "views", amx=amx).backend == "CPU_MLA"  # the MLA suites on every host
    refusal = host.mask_refusal("avx2", on.aten_capability)
    assert (refusal is None) is (kind == "avx2"), refusal
    case = amx_weight_sync_case(amx)
    assert case is AMX_MLA_WEIGHT_SYNC if kind == "amx" else "AMX tiles" in case


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_avx2_mask_on_recorded_hosts(name, monkeypatch, unmasked):
    """HARNESS_CPU_ISA=avx2 makes each kind of host an AVX2-only one: no AVX-512, no AMX, AVX2 kernels, and the
    backend chosen as without AMX."""
    monkeypatch.setenv(host.HIDE_ENV, "avx2")
    on = recorded(name)
    fp = host.fingerprint(on)
    assert set(fp["isa"]) == {"avx2", "fma"} and fp["aten_capability"] == "AVX2" and fp["mask"] == "avx2"
    assert not host.has_amx(on)
    assert host.same_kernels(fp, {**host.fingerprint(recorded("avx2-epyc")), "cpu": on.cpu})


def test_fingerprints_agree_only_on_every_kernel_field(unmasked):
    fps = {name: host.fingerprint(recorded(name)) for name in KINDS}
    for a, fa in fps.items():
        assert host.same_kernels(fa, dict(fa)) and host.differences(fa, fa) == "none"
        for b, fb in fps.items():
            if a != b:
                assert not host.same_kernels(fa, fb), (a, b)
    assert "+amx_tile" in host.differences(fps["amx-xeon"], fps["avx512-xeon"])
    assert "-amx_tile" in host.differences(fps["avx512-xeon"], fps["amx-xeon"])
    assert "aten_capability 'AVX2' vs 'AVX512'" in host.differences(fps["avx2-epyc"], fps["avx512-xeon"])
    assert not host.same_kernels(fps["amx-xeon"], None) and not host.same_kernels(None, None)
    here = host.fingerprint()
    capped = {**here, "env": {"MKL_CBWR": "AVX2"}}
    assert not host.same_kernels(here, capped) and "env" in host.differences(here, capped)
    assert host.same_kernels(here, {**here, "mask": "whatever"})  # the mask shows in isa/env, not by itself
    assert host.differences(here, None) == "host fingerprint unknown for the reference"
    with pytest.raises(BadInput, match="record the host unmasked"):
        host.Host.recorded({**RECORDED["amx-xeon"]["fingerprint"], "mask": "avx2"}, "masked")


@pytest.mark.parametrize("golden_host", sorted(KINDS))
@pytest.mark.parametrize("run_host", sorted(KINDS))
def test_exact_mode_on_recorded_hosts(golden_host, run_host, unmasked):
    """`compare --exact` is bit for bit only between runs of one kind of host, within the cross-host tolerance
    otherwise, and names the difference."""
    from harness.metrics.baseline import Baseline
    from harness.metrics.curves import compare_exact
    from harness.metrics.run import Run, RunMeta, Series

    def run(name, fp, nudge=0.0):
        values = tuple(-1.0 + 0.1 * s + (nudge if s == 3 else 0.0) for s in range(1, 11))
        return Run(name, {"critic/rewards/mean": Series(tuple(range(1, 11)), values)},
                   RunMeta(scale="tiny", hardware="cpu", versions={}, sources=(f"{name}.jsonl",),
                           extra={"seed": 0, "host": fp}))

    gf, rf = (host.fingerprint(recorded(n)) for n in (golden_host, run_host))
    golden = Baseline.from_runs([run("golden-s0", gf)], ("critic/rewards/mean",))
    alignment = compare_exact(run("candidate", rf, nudge=3e-8), golden)
    if golden_host == run_host:
        assert not alignment.passed  # bit for bit: a 3e-8 difference is a difference
        assert compare_exact(run("candidate", rf), golden).passed
    else:
        assert alignment.passed and "not bit for bit" in alignment.message(), alignment.message()
        assert host.differences(rf, gf) in alignment.message()


def test_the_amx_expectation_matches_what_the_amx_host_raised():
    """The recorded AMX host's weight sync raised RuntimeError (size 0 vs 512 in vLLM's layerwise reload), not the
    stale-weights AssertionError the old expectation named: the expectation accepts exactly the recorded failure."""
    import re

    from harness.config.platforms import AMX_MLA_WEIGHT_SYNC

    observed = RECORDED["amx-xeon"]["observed"]["suites/functional/test_mla_weight_sync.py::test_amx_mla_weight_sync"]
    kind, _, message = observed.partition(": ")
    assert kind == AMX_MLA_WEIGHT_SYNC.raises.__name__ and re.search(AMX_MLA_WEIGHT_SYNC.match, message)
    for other in ("vllm: W_UK_T/W_UV are not the derivation of the current kv_b_proj in 4 checks",
                  "The size of tensor a (7) must match the size of tensor b (512)"):
        assert not re.search(AMX_MLA_WEIGHT_SYNC.match, other)


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

    kept, caps = host.MASKS["avx2"][0], [k for k in host.KERNEL_ENV if k in os.environ]
    if host.isa() <= kept and not caps:  # 176 s of CI on this AVX2 EPYC, for a second run of the same kernels
        pytest.skip(f"nothing to hide: this host's ISA is {sorted(host.isa())}, so the masked session is this "
                    "session, which runs the decisive cases itself")
    root = Path(__file__).resolve().parent.parent
    clean = {k: v for k, v in os.environ.items() if k not in (host.HIDE_ENV, *host.KERNEL_ENV, "PYTEST_XDIST_WORKER")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *DECISIVE], cwd=root, env={**clean, host.HIDE_ENV: "avx2"}, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
