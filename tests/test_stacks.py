"""The supported-stack matrix (harness/config/stacks.py) and its constraint files agree; each supported NPU set
resolves against the package registry for the cluster's platform (marked `registry`: deselect offline with
-m "not registry"); `doctor` reports this CPU machine's tier and exits by the verdict."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.cli.doctor_cmd import _key_value_file, predict_suites
from harness.config.hardware import PROFILES, with_device_memory
from harness.config.stacks import STACKS, best_match, get_stack, mismatches

ROOT = Path(__file__).resolve().parent.parent
NPU_STACKS = [s for s in STACKS if s.constraints_file]
AARCH64 = ["manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_24_aarch64", "manylinux_2_17_aarch64",
           "manylinux2014_aarch64", "linux_aarch64"]


def _pins(path: Path) -> dict[str, str]:
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("==", 1) for ln in lines)


@pytest.mark.parametrize("stack", NPU_STACKS, ids=lambda s: s.name)
def test_constraint_file_is_the_stack(stack):
    path = ROOT / stack.constraints_file
    want = {p.name: p.version for p in stack.pins if p.how in ("registry", "no-deps")}
    assert _pins(path) == want, f"{path} drifted from harness/config/stacks.py"
    assert stack.env.get("VLLM_TARGET_DEVICE") == "empty" and stack.pin("vllm").how == "source"


def test_every_pin_names_its_source():
    assert all(p.source for s in STACKS for p in s.pins)
    assert all(s.reason for s in STACKS if not s.supported), "an unsupported row says why"


def test_supported_npu_stacks_fit_verl():
    """verl 0.9.1: transformers >=5.5.3,<5.11 (not 5.6.0), numpy >=2 -- the 0.19.1rc1 row (numpy<2) is out."""
    for stack in NPU_STACKS:
        major, minor, patch = (int(x) for x in stack.pin("transformers").version.split("."))
        assert (5, 5, 3) <= (major, minor, patch) < (5, 11, 0) and (major, minor, patch) != (5, 6, 0)
        assert stack.pin("megatron-core").version == "0.12.1" and stack.pin("mindspeed").how == "source"
    assert not get_stack("vllm-ascend-0.19.1rc1").supported


def test_matching_is_by_version():
    cpu = get_stack("cpu")
    exact = {p.name: p.version for p in cpu.pins}
    assert mismatches(cpu, {**exact, "torch": "2.13.0+cpu"}) == []
    wrong = mismatches(cpu, {**exact, "transformers": "5.5.3"})
    assert len(wrong) == 1 and wrong[0].startswith("transformers 5.5.3 (wants 5.19.0")
    stack, diff = best_match("npu", {p.name: p.version for p in get_stack("vllm-ascend-0.23.0").pins})
    assert (stack.name, diff) == ("vllm-ascend-0.23.0", [])


def test_device_memory_is_read_not_assumed():
    class Props:
        total_memory = 32 * 1024**3  # an Ascend 910B4

    assert with_device_memory(PROFILES["a2"], Props()).device_memory_gib == 32
    assert with_device_memory(PROFILES["a2"], object()).device_memory_gib == 64


def test_cann_version_file(tmp_path):
    info = tmp_path / "ascend_toolkit_install.info"
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.5.1\ninnerversion=V100R001C25\n")
    assert _key_value_file(info, "version") == "8.5.1"
    assert _key_value_file(tmp_path / "missing.info", "version") is None


def test_predictions_name_the_known_breaks():
    rows = {r["area"]: r for r in predict_suites("npu", {"mindspeed": "2.2.0", "torch-npu": "2.9.0",
                                                         "mbridge": "0.15.1"})}
    ms = next(r for a, r in rows.items() if "MindSpeed" in a)
    assert ms["verdict"] == "break" and "seed 001" in ms["reason"]
    cpu = {r["area"]: r for r in predict_suites("cpu", {})}
    assert all(r["verdict"] == "skip" for r in cpu.values())


def test_doctor_on_this_cpu_machine(capsys):
    code = main(["doctor", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["machine"]["kind"] == "cpu" and doc["tier"].startswith("CPU tier")
    assert code == (0 if doc["supported"] else 1)
    assert doc["stack"]["name"] == "cpu"


def test_doctor_bad_option_is_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "doctor", "--jsn"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--jsn" in proc.stderr


@pytest.mark.registry
@pytest.mark.parametrize("stack", NPU_STACKS, ids=lambda s: s.name)
def test_constraint_set_resolves_on_the_registry(stack, tmp_path):
    """`pip install --dry-run --report` of the constraint set for the clusters' platform (Kunpeng aarch64, the stack's
    Python): every registry pin exists and they are co-installable (binary wheels only, as a cluster installs them)."""
    platforms = [arg for p in AARCH64 for arg in ("--platform", p)]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--target", str(tmp_path / "t"), *platforms, "--python-version", stack.python, "--implementation", "cp",
         "--only-binary=:all:", "-r", str(ROOT / stack.constraints_file)],
        capture_output=True, text=True, timeout=1500)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
    assert proc.returncode == 0, f"{stack.constraints_file} does not resolve: {' | '.join(errors[-3:])}"
    installs = json.loads(report.read_text())["install"]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    for name, version in _pins(ROOT / stack.constraints_file).items():
        assert resolved.get(name.lower()) == version, f"{name}: resolved {resolved.get(name.lower())}, pinned {version}"


def test_r3_blockers_of_the_supported_stacks():
    """verl's R3 cannot work on either supported NPU stack: v0.20.2rc1's vLLM 0.20.2 is refused by verl, and both
    pin megatron-core 0.12.1, whose moe_utils lacks what verl's router_replay_patch imports. Decided by source
    where megatron-core's file is given: a moe_utils with every name is no blocker."""
    from harness.config.stacks import R3_MOE_UTILS_NAMES, get_stack, r3_blockers

    old, new = (get_stack(name) for name in ("vllm-ascend-0.20.2rc1", "vllm-ascend-0.23.0"))
    old_blocks = r3_blockers({p.name: p.version for p in old.pins})
    assert len(old_blocks) == 2 and "vLLM 0.20.2 < 0.22.0" in old_blocks[0] and "group_limited_topk" in old_blocks[1]
    assert len(r3_blockers({p.name: p.version for p in new.pins})) == 1
    fixed = "\n".join(f"def {n}(x):\n    pass" for n in R3_MOE_UTILS_NAMES)
    assert r3_blockers({"vllm": "0.23.0", "megatron-core": "0.12.1"}, moe_utils_source=fixed) == []
    partial = fixed.replace("def apply_router_token_dropping(", "def other(")
    assert "lacks apply_router_token_dropping" in r3_blockers({"megatron-core": "0.13.0"}, partial)[0]
    rows = {r["area"]: r for r in predict_suites("npu", {"verl": "0.9.1", "megatron-core": "0.12.1",
                                                         "vllm": "0.20.2"})}
    r3 = next(r for a, r in rows.items() if "R3" in a)
    assert r3["verdict"] == "break" and "0.22.0" in r3["reason"]
