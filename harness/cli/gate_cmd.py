"""`ascend-rl-harness gate --from A --to B`: the upgrade itself, gated (issue 35).

Each stack is built as a cached overlay over the installed one (harness.gate.overlays), the same selection runs in
each with `ascend-rl-harness run --scale tiny` (each side gets run's report set under --report-dir/A and /B), the
verl algorithm config each side resolves is compared, the tiny verl runs' curves of B are aligned against a golden
recorded from A's, and when a test that passed on A fails on B the moved packages are bisected with the cheapest
such test as the oracle. One verdict, SAFE / CHANGED / BROKEN, in gate.json, junit.xml, gate.md and the exit code
(0 SAFE or CHANGED, 1 BROKEN, 2 a stack that cannot be built or bad input).

`--dry-run` installs nothing: between two rows of the NPU stack table (harness/config/stacks.py) it lists every
package that moves and every known-bug row (harness/config/known_bugs.py) whose verdict changes.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.cli.output import emit, verdict
from harness.errors import BadInput

RUN_TIMEOUT_S = 3600  # one side's selection: the tiny tier's suites take ~10 min on 2 cores
ORACLE_TIMEOUT_S = 1200
STOP_S = 30  # a child's grace after SIGTERM to stop its tiny verl launcher and Ray before SIGKILL


def _say(text: str) -> None:
    """One progress line on stderr, terminal escapes removed (issue 48: a stack label's reached the terminal raw)."""
    from harness.redact import for_terminal

    print(f"gate: {for_terminal(text)}", file=sys.stderr, flush=True)


def cmd_gate(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _dry_run(args)
    from harness.gate import overlays as st
    from harness.io import exclusive
    from harness.plugin import check_report_dir

    started = time.time()  # a report older than this is an earlier gate's (issue 48), never this one's
    try:
        selection = shlex.split(args.select or "")
    except ValueError as exc:  # `--select "'"`: a traceback before issue 48
        raise BadInput(f"--select {st.shown(args.select)}: {exc}; quote pytest's arguments as a shell would") \
            from None
    installed = st.installed_versions()
    a = st.parse_stack(args.from_stack, "--from", installed)
    b = st.parse_stack(args.to_stack, "--to", installed)
    # Absolute before any child starts: `run` starts in the checkout, the gate's own files go where it was started;
    # a relative directory meant both (issue 48: from elsewhere it replaced the checkout's report set).
    out = check_report_dir(args.report_dir).absolute()
    with exclusive(out, "this gate's report directory"):
        for side in ("A", "B"):  # a side's directory another run holds: said now, not after A's whole selection
            with exclusive(check_report_dir(out / side), "this report directory"):
                pass
        return _gate(args, st, a, b, installed, selection, out, started)


def _gate(args, st, a, b, installed: dict, selection: list[str], out: Path, started: float) -> int:
    from harness.gate.verdict import BROKEN, bisect, compare, judged, oracle_test

    moves = st.moved(a, b, installed)
    timings: dict[str, float] = {}
    _say(f"{len(moves)} package(s) move: " + (", ".join(f"{n} {va} -> {vb}" for n, (va, vb) in moves.items())
                                              or "none"))

    def ready(stack):
        """(the stack's environment, its overlay, whether it was cached); StackSkip when it cannot be built."""
        overlay, cached = st.build(stack)
        return st.environment(overlay), overlay, cached

    # Both stacks are built before either selection runs (issue 48: an unbuildable B was said after A's whole run).
    envs, reports, configs = {}, {}, {}
    for side, stack, option in (("A", a, "--from"), ("B", b, "--to")):
        begun = time.monotonic()
        try:
            envs[side], overlay, cached = ready(stack)
        except st.StackSkip as exc:
            raise BadInput(f"{option} {stack.label}: SKIP, the stack cannot be built: {exc}") from None
        timings[f"build_{side}_s"] = round(time.monotonic() - begun, 1)
        _say(f"stack {side} ({stack.label}): " + ("the installed stack" if overlay is None else
                                                  f"overlay {overlay} ({'cached' if cached else 'built'}, "
                                                  f"{timings[f'build_{side}_s']} s)"))
    for side, option in (("A", "--from"), ("B", "--to")):
        shown = f" -- {st.shown(args.select)}" if args.select else ""
        _say(f"running the selection on {side} (`run --scale tiny{shown}`)")
        begun = time.monotonic()
        reports[side] = report = _run(envs[side], out / side, selection, option, side, started)
        timings[f"run_{side}_s"] = round(time.monotonic() - begun, 1)
        if side == "A" and not judged(report):  # issue 48: a selection of nothing was SAFE
            raise BadInput(f"--select {st.shown(args.select) or '(default)'}: no test was judged on A "
                           f"({_counts(report) or 'none collected'}); select tests that run on the tiny tier")
        configs[side] = _resolved(envs[side])
        _say(f"{side}: " + (_counts(report) if report else "the run crashed and wrote no report")
             + f" in {timings[f'run_{side}_s']} s")
    ra, rb = reports["A"], reports["B"]
    comparison = compare(ra, rb, configs["A"], configs["B"]) if rb is not None else None
    curves = _curves(ra, rb, out) if rb is not None else None
    state = comparison.verdict if comparison else BROKEN
    if curves and not curves["aligned"] and state != BROKEN:
        state = "CHANGED"
    bisection = None
    oracle = oracle_test(comparison) if comparison else None
    if state == BROKEN and oracle and moves and not args.no_bisect:
        _say(f"bisecting {len(moves)} moved package(s) with {oracle} as the oracle")

        def reproduces(names: set[str]):
            begun = time.monotonic()
            try:
                env, _, _ = ready(st.combine(a, b, names))
            except st.StackSkip as exc:
                return None, str(exc), time.monotonic() - begun
            code = _pytest(env, [oracle])
            result = None if code in (4, 5) else code != 0
            _say(f"  A + {', '.join(sorted(names))}: " + {True: "reproduces", False: "passes",
                                                          None: f"SKIP (pytest exit {code})"}[result])
            return result, f"pytest exit {code}", time.monotonic() - begun

        begun = time.monotonic()
        bisection = bisect(list(moves), reproduces)
        timings["bisect_s"] = round(time.monotonic() - begun, 1)
    doc = {
        "from": a.label, "to": b.label, "selection": selection,
        "moved": {n: {"a": va, "b": vb} for n, (va, vb) in moves.items()},
        "versions": {side: (r.machine.packages if r else {}) for side, r in reports.items()},
        "reports": {side: str(out / side) for side in reports},
        "comparison": comparison.to_json() if comparison else None, "curves": curves,
        "oracle": oracle, "bisection": bisection.to_json() if bisection else None,
        "named": _named(bisection, moves, oracle) if bisection else None,
        "timings": timings,
    }
    doc = verdict(state != BROKEN, state, doc)
    _write(out, doc)
    if args.json:
        return emit(doc)
    _print(doc)
    return 0 if doc["passed"] else 1


def _counts(report) -> str:
    return ", ".join(f"{v} {k}" for k, v in report.counts.items() if v)


def _run(env: dict, report_dir: Path, selection: list[str], option: str, side: str, started: float):
    """`run --scale tiny [-- selection]` on one stack: its RunReport, or None when the run crashed on B. Judged by
    the child's exit code and a report written after `started` only (issue 48: a stale report.json of an earlier
    gate made a broken stack SAFE). `run`'s exit 2 (its report directory locked, a full disk, a usage error) is
    no verdict: its one line, exit 2."""
    from harness.report.publish import LOG_NAME
    from harness.report.schema import load_report

    argv = [sys.executable, "-m", "harness.cli", "run", "--scale", "tiny", "--report-dir", str(report_dir)]
    code, tail = _child(f"the run on {side}", [*argv, "--", *selection] if selection else argv,
                        {**env, "COLUMNS": "120"}, RUN_TIMEOUT_S,
                        show=lambda line: _say(f"  {side}: {line[:200]}"))
    path = report_dir / "report.json"
    if code in (0, 1) and _fresh(path, started):
        return load_report(path)
    last = next((line for line in reversed(tail) if ": error: " in line), tail[-1] if tail else f"exit {code}")
    logs = [str(p) for p in (report_dir / "pytest-failed.log", report_dir / LOG_NAME) if _fresh(p, started)]
    why = last.strip()[-300:]
    if logs and logs[0] not in why:  # only a log this run wrote (issue 48 named A/pytest.log, never written)
        why += f" (see {logs[0]})"
    if code == 2:
        raise BadInput(f"{option}: `run` on {side} judged nothing: {why}")
    if side == "A":
        raise BadInput(f"{option}: the selection crashed on the reference stack A (exit {code}): {why}")
    _say(f"B crashed (exit {code}): {why}")
    return None


def _fresh(path: Path, started: float) -> bool:
    """`path` is a file written since `started` (time.time(); the file system's clock may be a tick behind)."""
    try:
        return path.is_file() and path.stat().st_mtime >= started - 1.0
    except OSError:
        return False


def _child(what: str, argv: list[str], env: dict, timeout_s: float, show=None) -> tuple[int, list[str]]:
    """Run `argv` in the checkout in a process group of its own, each line of its output (stdout and stderr) to
    `show`: (its exit code, its last lines). Past `timeout_s`, or when the gate is interrupted, the whole group is
    stopped (_stop; issue 48: on SIGTERM the gate waited for its child's whole run, up to an hour, and a SIGINT
    sent to the gate alone left the child running)."""
    from harness.cli.run_cmd import CHECKOUT

    tail: collections.deque[str] = collections.deque(maxlen=20)
    proc = subprocess.Popen(argv, env=env, cwd=CHECKOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    watchdog = threading.Timer(timeout_s, _stop, (proc,))
    watchdog.start()
    try:
        for line in proc.stdout:
            if line.strip():
                tail.append(line.rstrip()[-2000:])
                if show:
                    show(line.rstrip())
        return proc.wait(), list(tail)
    except BaseException:  # SIGINT, SIGTERM (harness.errors.Terminated): the child's group goes with the gate
        _stop(proc)
        _say(f"interrupted: stopped {what} and its processes (its exit {proc.returncode})")
        raise
    finally:
        watchdog.cancel()
        proc.stdout.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `proc`'s process group (`run` stops its launcher and Ray on it, harness.errors.Terminated), then
    SIGKILL to what is left of the group after STOP_S."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _pytest(env: dict, nodeids: list[str]) -> int:
    return _child("the bisection's oracle",
                  [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--scale", "tiny", *nodeids],
                  env, ORACLE_TIMEOUT_S)[0]


def _resolved(env: dict) -> dict:
    """The verl algorithm config this stack resolves (harness.gate.resolved), or the one-line reason it cannot."""
    proc = subprocess.run([sys.executable, "-m", "harness.gate.resolved"], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        return {"<unresolved>": (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1][:300]}
    return json.loads(proc.stdout)


def _curves(ra, rb, out: Path) -> dict | None:
    """B's tiny verl run aligned against a golden recorded from A's (both runs as the suites kept them)."""
    def run_dir(report, side: str) -> str | None:
        # the report set keeps a copy of each run a verdict was computed from, its test's `run_dir` property
        # pointing at it (harness.report.publish.keep_evidence: relative to the set)
        for _, kept in report.properties("run_dir"):
            if isinstance(kept, str) and (out / side / kept / "metrics.jsonl").is_file():
                return str(out / side / kept)
        return None

    da, db = run_dir(ra, "A"), run_dir(rb, "B")
    if not (da and db):
        return None
    phases = _phases(da, db)
    golden = out / "A-golden.json"
    record = subprocess.run([sys.executable, "-m", "harness.cli", "baseline", "record", da, "--out", str(golden),
                             "--force", "--json"], capture_output=True, text=True, timeout=600)
    if record.returncode != 0:
        return {"aligned": True, "note": f"no golden from A's run ({record.stderr.strip()[-200:]})", "phases": phases}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "compare", db, str(golden), "--json"],
                          capture_output=True, text=True, timeout=600)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"aligned": True, "note": f"compare gave no verdict ({proc.stderr.strip()[-200:]})", "phases": phases}
    return {"aligned": bool(doc.get("passed")), "state": doc.get("state"), "golden": str(golden),
            "candidate": db, "misaligned": [m for m in doc.get("metrics", []) if not m.get("passed", True)][:10],
            "phases": phases}


def _phases(da: str, db: str) -> dict[str, dict]:
    """Each phase's time of the two tiny verl runs (verl's timing_s/*, the median step after the first, which
    compiles and warms up), throughput, and start-up (the job's wall time less its steps): informative, a shared
    2-core host moves them by tens of percent."""
    import statistics

    from harness.metrics.ingest import load_run

    def medians(run_dir: str) -> dict[str, float]:
        run = load_run(run_dir, strict=False)
        out = {}
        for key, series in run.series.items():
            if key.startswith("timing_s/") or key == "perf/throughput":
                later = [v for step, v in zip(series.steps, series.values, strict=True) if step > series.steps[0]]
                if later:
                    out[key] = statistics.median(later)
        launch = Path(run_dir) / "launch.json"
        if launch.is_file() and "timing_s/step" in run.series:
            elapsed = json.loads(launch.read_text()).get("elapsed_s")
            if isinstance(elapsed, (int, float)):
                out["start-up_s"] = max(0.0, elapsed - sum(run["timing_s/step"].values))
        return out

    try:
        ma, mb = medians(da), medians(db)
    except BadInput:
        return {}
    return {k: {"a": round(ma[k], 4), "b": round(mb[k], 4), "ratio": round(mb[k] / ma[k], 3) if ma[k] else None}
            for k in sorted(set(ma) & set(mb))}


def _named(bisection, moves: dict, oracle: str | None) -> str | None:
    if not bisection.packages:
        return None
    parts = [f"{n} {moves[n][0]} -> {moves[n][1]}" for n in bisection.packages]
    return f"{' + '.join(parts)} (first test: {oracle})"


def _write(out: Path, doc: dict) -> None:
    from harness.io import write_atomic
    from harness.numeric import json_text

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "gate.json", json_text(doc) + "\n")
    write_atomic(out / "junit.xml", _junit(doc))
    write_atomic(out / "gate.md", _markdown(doc))
    write_atomic(out / "gate.html", _html(doc))


def _junit(doc: dict) -> str:
    """One test case for the gate, one per broken test; every text through harness.report.junit's XML escape (issue
    48: a label's control characters made a junit.xml no parser reads)."""
    from xml.etree import ElementTree as ET

    from harness.report.junit import _text

    comparison = doc["comparison"] or {"broken": [], "flipped": [], "config": []}
    failures = len(comparison["broken"]) + (doc["state"] == "BROKEN")
    suite = ET.Element("testsuite", name="gate", tests=str(1 + len(comparison["broken"])), failures=str(failures))
    case = ET.SubElement(suite, "testcase", classname="gate", name=_text(f"{doc['from']} -> {doc['to']}"))
    if doc["state"] == "BROKEN":
        ET.SubElement(case, "failure", message=_text(doc.get("named") or "BROKEN")).text = _text(
            json.dumps(comparison["broken"]))
    for row in comparison["broken"]:
        broke = ET.SubElement(suite, "testcase", classname="gate.broken", name=_text(row["test"]))
        ET.SubElement(broke, "failure", message=f"{row['a']} on A, {row['b']} on B").text = _text(row["reason_b"])
    return ET.tostring(suite, encoding="unicode") + "\n"


def _markdown(doc: dict) -> str:
    lines = [f"# gate {doc['from']} -> {doc['to']}: {doc['state']}", ""]
    lines += [f"- {n}: {v['a']} -> {v['b']}" for n, v in doc["moved"].items()] or ["- nothing moves"]
    comparison = doc["comparison"]
    if comparison:
        for title, key in (("broken (passed on A, failing on B)", "broken"), ("other outcome changes", "flipped")):
            if comparison[key]:
                lines += ["", f"## {title}", ""] + [f"- `{r['test']}`: {r['a']} -> {r['b']}" for r in comparison[key]]
        if comparison["config"]:
            lines += ["", "## verl config resolved differently", ""]
            lines += [f"- `{r['key']}`: {r['a']!r} -> {r['b']!r}" for r in comparison["config"]]
        if comparison["numbers"]:
            lines += ["", "## numbers that moved (informative)", ""]
            lines += [f"- `{r['test']}` {r['property']}: {r['a']:.4g} -> {r['b']:.4g}" for r in comparison["numbers"]]
    if doc["curves"]:
        lines += ["", f"curves of B against a golden from A: {'aligned' if doc['curves']['aligned'] else 'MISALIGNED'}"]
        phases = doc["curves"].get("phases") or {}
        if phases:
            lines += ["", "## the tiny verl runs per phase (median step after the first; informative)", ""]
            lines += [f"- `{k}`: {v['a']:.4g} -> {v['b']:.4g}" + (f" (x{v['ratio']:.2f})" if v["ratio"] else "")
                      for k, v in phases.items()]
    if doc["bisection"]:
        lines += ["", f"## bisection: {doc['named'] or 'no smaller set reproduces'}", ""]
        lines += [f"- A + {', '.join(step['packages'])}: {step['outcome']} ({step['seconds']} s)"
                  for step in doc["bisection"]["steps"]]
    lines += ["", "timings: " + ", ".join(f"{k} {v}" for k, v in doc["timings"].items())]
    return "\n".join(lines) + "\n"


GATE_PAGE = """<h1>gate {{ doc.from }} &rarr; {{ doc.to }}: {{ doc.state }}</h1>
<p>each side's own report: <a href="A/report.html">A ({{ doc.from }})</a>, <a href="B/report.html">B ({{ doc.to }})</a>;
<a href="gate.json">gate.json</a>, <a href="junit.xml">junit.xml</a></p>
<pre>{{ text }}</pre>"""


def _html(doc: dict) -> str:
    """gate.md on a page of the report's own frame (harness.report.page), linking both sides' report sets."""
    from harness.report.page import page, render

    return page(f"gate {doc['from']} -> {doc['to']}: {doc['state']}", render(GATE_PAGE, doc=doc, text=_markdown(doc)))


def _print(doc: dict) -> None:
    from harness.redact import for_terminal

    print(for_terminal(_markdown(doc)), end="")
    print(for_terminal(f"{doc['state']}: {doc['from']} -> {doc['to']}" + (f"; broke: {doc['named']}" if doc.get(
        "named") else "") + f" (report {doc['reports']['B'].rsplit('/', 1)[0]}/gate.json)"))


def _dry_run(args: argparse.Namespace) -> int:
    """Two NPU stack rows: what moves and which known-bug verdicts change; nothing installed."""
    from harness.config.known_bugs import KNOWN_BUGS, check, in_range, stack_row
    from harness.gate import overlays as st
    from harness.io import file_kind

    def affected(bug, versions: dict) -> str:
        """Whether the stack holds the row's components at affected versions: affected / not affected / absent."""
        ranges = ((bug.component, bug.affected), *bug.also)
        if any(versions.get(name) is None for name, _ in ranges):
            return "absent"
        return "affected" if all(not spec or in_range(versions[name], spec) for name, spec in ranges) else "clear"

    def versions(name: str, option: str) -> dict:
        """A row's versions; for a constraints file, what the file pins over the row it is named after (issue 48:
        the file was taken by its name only, its content never read)."""
        row = stack_row(name, option)
        pinned = {"python": row.python, **{p.name: p.version for p in row.pins}}
        if file_kind(name) == "regular file":
            pinned.update(st.parse_stack(name, option, {}).versions({}))
        return pinned

    va, vb = versions(args.from_stack, "--from"), versions(args.to_stack, "--to")
    moves = {n: {"a": va.get(n), "b": vb.get(n)} for n in sorted(set(va) | set(vb)) if va.get(n) != vb.get(n)}
    hits_a = {h.bug.id: h for h in check(va, {}, {}, installed=False)}
    hits_b = {h.bug.id: h for h in check(vb, {}, {}, installed=False)}

    def state(hit) -> str:
        return "clear" if hit is None else "HIT" if hit.certain else "RISK"

    changes = [{"id": bug, "a": state(hits_a.get(bug)), "b": state(hits_b.get(bug))}
               for bug in sorted(set(hits_a) | set(hits_b)) if state(hits_a.get(bug)) != state(hits_b.get(bug))]
    # rows whose affected versions the move enters or leaves, whatever a recipe sets (the verdicts above are for
    # verl's defaults: a row that needs router replay or sleep level 2 hits only a recipe that sets it)
    ranges = [{"id": bug.id, "a": affected(bug, va), "b": affected(bug, vb)} for bug in KNOWN_BUGS
              if affected(bug, va) != affected(bug, vb) and bug.id not in {c["id"] for c in changes}]
    doc = verdict(True, "DRY-RUN", {"from": args.from_stack, "to": args.to_stack, "moved": moves,
                                    "known_bugs_changed": changes, "known_bugs_range_changed": ranges,
                                    "known_bugs_a": sorted(hits_a), "known_bugs_b": sorted(hits_b)})
    if args.json:
        return emit(doc)
    print(f"gate --dry-run {args.from_stack} -> {args.to_stack}: {len(moves)} package(s) move, "
          f"{len(changes)} known-bug verdict(s) change with verl's defaults, {len(ranges)} row(s) enter or leave "
          "their affected versions (nothing installed)")
    for name, v in moves.items():
        print(f"  {name}: {v['a']} -> {v['b']}")
    for row in changes:
        print(f"  known bug {row['id']}: {row['a']} -> {row['b']} (with verl's defaults)")
    for row in ranges:
        print(f"  known bug {row['id']}: versions {row['a']} -> {row['b']} (a recipe that triggers it decides)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("gate", help="the upgrade gated: two stacks side by side on the CPU tier, SAFE / CHANGED / "
                                    "BROKEN, and the package that broke it")
    p.add_argument("--from", dest="from_stack", required=True, metavar="STACK",
                   help="the stack now: `installed`, a requirements/constraints file, or `pkg==version` and wheel "
                        "paths (comma separated) over the installed one; with --dry-run a stack-table row")
    p.add_argument("--to", dest="to_stack", required=True, metavar="STACK", help="the candidate stack (as --from)")
    p.add_argument("--select", default="", metavar="PYTEST_ARGS",
                   help="the selection both stacks run, as pytest arguments after `run --scale tiny --` (default: "
                        "the tiny tier's suites, the tiny verl run included), e.g. \"-k advantage\"")
    p.add_argument("--report-dir", default="reports/gate", help="where A/, B/ (run's report sets), gate.json, "
                                                                "junit.xml and gate.md go (default reports/gate)")
    p.add_argument("--no-bisect", action="store_true", help="report BROKEN without bisecting the moved packages")
    p.add_argument("--dry-run", action="store_true", help="NPU stack rows: list moved packages and the known-bug "
                                                          "verdicts that change; install nothing")
    p.add_argument("--json", action="store_true", help="print gate.json")
    p.set_defaults(func=cmd_gate)
