"""Hardware detection and profiles, the device-generic `device` fixture, and the deterministic environment."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest

from harness.config import hardware as hw


def test_detects_this_machine_without_touching_torch_npu():
    import torch

    assert hw.npu_available() is False or hw.detect().kind == "npu"
    expected = "npu" if hw.npu_available() else "gpu" if torch.cuda.is_available() else "cpu"
    found = hw.detect()
    assert found.kind == expected
    if expected == "cpu":
        assert found.profile.name == "cpu" and found.satisfies("cpu") and not found.satisfies("npu")
        assert not found.satisfies("a2") and not found.satisfies("gpu")


@pytest.mark.parametrize("kind, name, profile, dies, hbm", [
    ("npu", "Ascend910B2", "a2", 1, 64),
    ("npu", "Ascend910B3", "a2", 1, 64),
    ("npu", "Ascend910_9391", "a3", 2, 64),  # Atlas A3: two dies per card, each a 64 GB torch device
    ("npu", "Ascend910_9392", "a3", 2, 64),
    ("gpu", "NVIDIA H100 80GB HBM3", "h100", 1, 80),
    ("gpu", "NVIDIA H200", "h200", 1, 141),
])
def test_profile_for_device_name(kind, name, profile, dies, hbm):
    p = hw.profile_for_device_name(kind, name)
    assert (p.name, p.kind, p.dies_per_card, p.device_memory_gib) == (profile, kind, dies, hbm)


def test_unknown_devices_get_a_named_profile():
    assert hw.profile_for_device_name("npu", "Ascend310P3").name == "npu:Ascend310P3"
    assert hw.profile_for_device_name("gpu", "NVIDIA A10").name == "gpu:NVIDIA A10"


def test_a3_counts_cards_from_dies():
    found = hw.Detected("npu", hw.PROFILES["a3"], 16, "Ascend910_9391")
    assert found.cards == 8 and found.satisfies("a3") and found.satisfies("npu") and not found.satisfies("a2")


def test_resolve_rejects_absent_or_unknown_hardware():
    with pytest.raises(hw.HardwareError, match="is not one of auto, cpu, gpu, npu, a2, a3"):
        hw.resolve("tpu")
    if hw.detect().kind == "cpu":
        with pytest.raises(hw.HardwareError, match="--hardware npu requested but this machine has cpu"):
            hw.resolve("npu")


def test_broken_torch_npu_is_one_line_hardware_error(broken_torch_npu):
    with pytest.raises(hw.HardwareError) as err:
        hw.detect()
    message = str(err.value)
    assert "\n" not in message
    assert "torch_npu is installed but fails to import" in message and "libhccl.so" in message
    assert "set_env.sh" in message  # says what to do


def test_broken_torch_npu_leaves_import_torch_working(broken_torch_npu):
    # In a fresh interpreter: `import torch` succeeds, detection fails with the one-line HardwareError.
    code = textwrap.dedent("""
        import torch
        from harness.config import hardware
        try:
            hardware.detect()
        except hardware.HardwareError as exc:
            print("HardwareError:", exc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_torch_npu), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("HardwareError:")]
    assert len(lines) == 1 and "libhccl.so" in lines[0], proc.stdout


def test_device_fixture_covers_present_devices(device):
    import torch

    assert device in hw.torch_device_types()
    x = torch.ones(4, device=device)
    assert x.sum().item() == 4


def test_device_types_always_include_cpu():
    assert hw.torch_device_types(hw.Detected("cpu", hw.PROFILES["cpu"], 2, "cpu")) == ["cpu"]
    assert hw.torch_device_types(hw.Detected("npu", hw.PROFILES["a3"], 16, "Ascend910_9391")) == ["npu", "cpu"]


def test_deterministic_env_sets_env_and_seeds(deterministic_env):
    import numpy as np
    import torch

    assert deterministic_env == hw.DETERMINISTIC_ENV
    assert {k: os.environ.get(k) for k in hw.DETERMINISTIC_ENV} == hw.DETERMINISTIC_ENV
    # msprobe seed_all(seed=1234, mode=True): deterministic algorithms on, every RNG seeded with 1234
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(4), torch.rand(4, generator=torch.Generator().manual_seed(1234)))
    assert random.random() == random.Random(1234).random()
    assert np.random.rand() == np.random.RandomState(1234).rand()
