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
from harness.cli.doctor_cmd import predict_suites
from harness.config.hardware import PROFILES, with_device_memory
from harness.config.installed import Detection, key_value_file
from harness.config.stacks import MBRIDGE_COMMIT, STACKS, best_match, get_stack, mismatches

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
        assert stack.pin("megatron-core").version in ("0.12.1", "0.16.0") and stack.pin("mindspeed").how == "source"
    assert not get_stack("vllm-ascend-0.19.1rc1").supported


def test_matching_is_by_version():
    cpu = get_stack("cpu")
    exact = {p.name: p.version for p in cpu.pins}
    assert mismatches(cpu, {**exact, "torch": "2.13.0+cpu"}) == []
    wrong = mismatches(cpu, {**exact, "transformers": "5.5.3"})
    assert len(wrong) == 1 and wrong[0].startswith("transformers 5.5.3 (wants 5.19.0")
    # MindSpeed and mbridge report 0.12.1 / 0.15.1 whatever their source: matched by that AND by their code
    reported = {p.name: p.reports or p.version for p in get_stack("vllm-ascend-0.23.0").pins}
    assert reported["mindspeed"] == "0.12.1" and reported["mbridge"] == "0.15.1"
    stack, diff = best_match("npu", reported, {"mindspeed": False, "mbridge": False})
    assert (stack.name, diff) == ("vllm-ascend-0.23.0", [])
    _, unknown = best_match("npu", reported)  # code not read: never silently supported
    assert len(unknown) == 2 and all("could not tell" in line for line in unknown)
    (scale,) = mismatches(stack, reported, {"mindspeed": True, "mbridge": False})
    assert scale.startswith("mindspeed 0.12.1: seed 001's MLA softmax scale")
    assert mismatches(stack, {**reported, "mindspeed": "2.3.0_core_r0.12.1"}, {"mindspeed": False, "mbridge": False})


def test_the_core_r0_16_row_accepts_both_canns_its_upstreams_name():
    """Issue 46 m6: verl v0.9.0's install guide pairs CANN 9.0.0 with vllm-ascend 0.23.0, vllm-ascend v0.23.0's
    requires 9.1.0; a machine installed per either is on the row, another CANN is not."""
    row = get_stack("vllm-ascend-0.23.0-mcore-0.16")
    exact = {p.name: p.reports or p.version for p in row.pins}
    bugs = {"mindspeed": False, "mbridge": False}
    for cann in ("9.0.0", "9.1.0"):
        assert mismatches(row, {**exact, "CANN": cann}, bugs) == [], cann
    assert [m.split(" (")[0] for m in mismatches(row, {**exact, "CANN": "8.5.0"}, bugs)] == ["CANN 8.5.0"]


def test_device_memory_is_read_not_assumed():
    class Props:
        total_memory = 32 * 1024**3  # an Ascend 910B4

    assert with_device_memory(PROFILES["a2"], Props()).device_memory_gib == 32
    assert with_device_memory(PROFILES["a2"], object()).device_memory_gib == 64


def test_cann_version_file(tmp_path):
    info = tmp_path / "ascend_toolkit_install.info"
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.5.1\ninnerversion=V100R001C25\n")
    assert key_value_file(info, "version") == "8.5.1"
    assert key_value_file(tmp_path / "missing.info", "version") is None


def test_predictions_name_the_known_breaks():
    have = {"mindspeed": "0.12.1", "torch-npu": "2.9.0", "mbridge": "0.15.1"}
    bug = Detection(True, "adaptor.py: passes scale=0.125 to npu_fusion_attention (seed 001's MLA scale bug)")
    rows = {r["area"]: r for r in predict_suites("npu", have, {"mindspeed": bug})}
    ms = next(r for a, r in rows.items() if "MindSpeed" in a)
    assert ms["verdict"] == "break" and "seed 001" in ms["reason"]
    fixed = {r["area"]: r for r in predict_suites("npu", have, {"mindspeed": Detection(False, "passes softmax_scale")})}
    assert next(r for a, r in fixed.items() if "MindSpeed" in a)["verdict"] == "run"
    cpu = {r["area"]: r for r in predict_suites("cpu", {})}
    assert all(r["verdict"] == "skip" for r in cpu.values())


@pytest.mark.parametrize("stack", NPU_STACKS, ids=lambda s: s.name)
def test_install_script_builds_from_the_pinned_sources(stack):
    """What a stack prints is what its vllm-ascend Dockerfile does (vllm-project/vllm-ascend <tag> Dockerfile):
    vLLM from a checkout of its tag with VLLM_TARGET_DEVICE=empty (a registry `pip install vllm==X` takes the CUDA
    wheel), vllm-ascend from its checkout with CANN and ATB sourced, the PyTorch CPU index (x86_64 torch-npu needs
    torch==2.10.0+cpu), then MindSpeed and mbridge from source by tag / full commit, in an installable URL."""
    script = stack.install_script()
    lines = [ln for ln in script.splitlines() if ln and not ln.startswith("#")]
    tag, vllm = "v" + stack.pin("vllm-ascend").version, stack.pin("vllm").version
    assert lines[:3] == ["set -euo pipefail", "source /usr/local/Ascend/ascend-toolkit/set_env.sh",
                         "source /usr/local/Ascend/nnal/atb/set_env.sh"]
    assert f"git clone --depth 1 -b v{vllm} https://github.com/vllm-project/vllm.git" in script
    assert 'VLLM_TARGET_DEVICE=empty python3 -m pip install -e "$SRC/vllm"' in script
    assert f"git clone --depth 1 -b {tag} https://github.com/vllm-project/vllm-ascend.git" in script
    # its build requires triton-ascend (pyproject.toml), served only by Huawei's Ascend index (the Dockerfile's
    # PIP_EXTRA_INDEX_URL for this step): a bare-metal / tox install failed without it
    assert ('PIP_EXTRA_INDEX_URL=https://mirrors.huaweicloud.com/ascend/repos/pypi python3 -m pip install -e '
            '"$SRC/vllm-ascend"') in script
    assert "pip install vllm==" not in script and "pip install vllm-ascend==" not in script
    assert f"have vllm {vllm} ||" in script and f"have vllm-ascend {tag[1:]} ||" in script  # skipped in the image
    cpu_index = "--extra-index-url https://download.pytorch.org/whl/cpu/"
    assert f"-r requirements/npu.txt -c {stack.constraints_file} {cpu_index}" in script
    mindspeed = "core_r0.16.0" if stack.pin("megatron-core").version == "0.16.0" else "v2.3.0_core_r0.12.1"
    assert f"git clone --depth 1 -b {mindspeed} https://github.com/Ascend/MindSpeed.git" in script
    assert f"'mbridge @ git+https://github.com/ISEEKYAN/mbridge@{MBRIDGE_COMMIT}'" in script
    assert lines[-1] == "python3 -m pip install --no-deps -e ."
    # the order that works: the sources before the constraint set, MindSpeed / mbridge after it (--no-deps)
    steps = ("vllm.git", "vllm-ascend.git", "-r requirements/npu.txt", "ISEEKYAN/mbridge@")
    order = [script.index(s) for s in steps]
    assert order == sorted(order)
    if stack.pin("mindspeed").reports:  # a version that lies: reinstalled after the constraint set, every time
        assert script.index("-r requirements/npu.txt") < script.index("MindSpeed.git")
    proc = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("stack", NPU_STACKS, ids=lambda s: s.name)
def test_megatron_core_goes_in_without_its_dependency_set(stack):
    """Issue 46, m5: megatron-core from requirements/npu.txt pulled nvidia-modelopt, wandb, zarr... (and 0.12.1,
    with no aarch64 wheel, built its sdist); it goes in --no-deps after the constraint set, as on CPU."""
    script = stack.install_script()
    pin = stack.pin("megatron-core")
    line = f"python3 -m pip install --no-deps megatron-core=={pin.version}"
    assert pin.how == "no-deps" and line in script.splitlines()
    assert script.index("-r requirements/npu.txt") < script.index(line)
    assert "megatron-core" not in _pins_and_names(ROOT / "requirements/npu.txt")


def test_mbridge_pin_is_the_commit_it_installs():
    pin = get_stack("vllm-ascend-0.23.0").pin("mbridge")
    assert len(MBRIDGE_COMMIT) == 40 and pin.version == MBRIDGE_COMMIT and pin.install.endswith(f"@{MBRIDGE_COMMIT}'")
    assert "(ISEEKYAN/mbridge)" not in pin.install, "git+(owner/repo) is not a URL pip can install"
    assert "vllm-ascend" not in _pins_and_names(ROOT / "requirements/npu.txt"), \
        "vllm-ascend is built from its checkout; unpinned in npu.txt pip would build the newest sdist"


def _pins_and_names(path: Path) -> set[str]:
    return {ln.split("=")[0].split("[")[0].strip() for ln in path.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}


def test_install_script_cli():
    proc = subprocess.run([sys.executable, "-m", "harness.config.stacks", "vllm-ascend-0.23.0"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == get_stack("vllm-ascend-0.23.0").install_script()
    bad = subprocess.run(["bash", str(ROOT / "scripts/install-npu-stack"), "vllm-ascend-9.9"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "vllm-ascend-0.23.0" in bad.stderr and "\n" not in bad.stderr.strip()


def _commands(lines: list[str]) -> list[str]:
    return [ln.split("  #")[0].strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def test_readme_npu_install_is_what_the_nightly_runs():
    """The README's NPU install block and the nightly workflow's install step are the same commands (the stack
    from the workflow's NPU_STACK), started from the image of that stack."""
    import yaml

    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- npu-install: the nightly workflow runs exactly these lines -->", 1)[1]
    block = block.split("```bash\n", 1)[1].split("```", 1)[0]
    workflow = yaml.safe_load((ROOT / ".github/workflows/nightly-npu.yml").read_text())
    job = workflow["jobs"]["nightly"]
    step = next(s for s in job["steps"] if s.get("name", "").startswith("Install"))
    stack = get_stack(job["env"]["NPU_STACK"])
    readme_commands = _commands(block.splitlines())
    assert readme_commands[0] == f"export NPU_STACK={stack.name}", "the README names the workflow's stack"
    assert readme_commands[1:] == _commands(step["run"].splitlines())
    for entry in job["strategy"]["matrix"]["include"]:
        assert entry["image"] == stack.images[entry["hardware"]], "the night starts from the stack's vllm-ascend image"


def test_doctor_on_this_cpu_machine(capsys):
    code = main(["doctor", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["machine"]["kind"] == "cpu" and doc["tier"].startswith("CPU tier")
    assert code == (0 if doc["passed"] else 1)
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
    # the --no-deps pins (megatron-core: 0.12.1 has no aarch64 wheel) are installed alone, from a wheel or an sdist
    no_deps = {p.name for p in stack.pins if p.how == "no-deps"}
    binary = tmp_path / "binary.txt"
    binary.write_text("".join(f"{n}=={v}\n" for n, v in _pins(ROOT / stack.constraints_file).items()
                              if n not in no_deps))
    for pin in (p for p in stack.pins if p.how == "no-deps"):
        found = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
                                str(tmp_path / "d"), f"{pin.name}=={pin.version}"],
                               capture_output=True, text=True, timeout=600)
        assert found.returncode == 0, f"{pin.name}=={pin.version} is not on the registry: {found.stderr[-300:]}"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--target", str(tmp_path / "t"), *platforms, "--python-version", stack.python, "--implementation", "cp",
         "--only-binary=:all:", "-r", str(binary)],
        capture_output=True, text=True, timeout=1500)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
    assert proc.returncode == 0, f"{stack.constraints_file} does not resolve: {' | '.join(errors[-3:])}"
    installs = json.loads(report.read_text())["install"]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    for name, version in _pins(binary).items():
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
    # by version where the source is not at hand: core_v0.13.x still lacks the names, core_v0.14.0 has them
    assert "lacks apply_router_token_dropping" in r3_blockers({"vllm": "0.23.0", "megatron-core": "0.13.1"})[0]
    assert r3_blockers({"vllm": "0.23.0", "megatron-core": "0.14.0"}) == []
    partial = fixed.replace("def apply_router_token_dropping(", "def other(")
    assert "lacks apply_router_token_dropping" in r3_blockers({"megatron-core": "0.13.0"}, partial)[0]
    rows = {r["area"]: r for r in predict_suites("npu", {"verl": "0.9.1", "megatron-core": "0.12.1",
                                                         "vllm": "0.20.2"})}
    r3 = next(r for a, r in rows.items() if "R3" in a)
    assert r3["verdict"] == "break" and "0.22.0" in r3["reason"]


def test_both_megatron_lines_are_rows():
    """verl v0.9.0's own NPU install (install_guidance.rst, install_vllm_mcore_npu.sh) pairs vllm-ascend 0.23.0 with
    Megatron-LM / MindSpeed core_r0.16.0 and transformers 5.10.4; seed 002's line is core_r0.12.1. Both are rows, the
    0.16 one without R3's megatron-core blocker; doctor matches a machine of that line to its row."""
    from harness.config.stacks import r3_blockers

    old, new = get_stack("vllm-ascend-0.23.0"), get_stack("vllm-ascend-0.23.0-mcore-0.16")
    assert (old.pin("megatron-core").version, new.pin("megatron-core").version) == ("0.12.1", "0.16.0")
    assert new.pin("transformers").version == "5.10.4" and new.pin("mindspeed").version == "0.16.0"
    assert len(r3_blockers({p.name: p.version for p in old.pins})) == 1
    assert r3_blockers({p.name: p.version for p in new.pins}) == []
    have = {p.name: p.reports or p.version for p in new.pins}
    stack, diff = best_match("npu", have, {"mbridge": False})
    assert (stack.name, diff) == (new.name, [])

