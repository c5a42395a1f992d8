"""`ascend-rl-harness gate --from A --to B`: the upgrade itself, gated (issue 35).

Each stack is built as a cached overlay over the installed one (harness.gate.stacks), the same selection runs in
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
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.cli.output import emit, verdict
from harness.errors import BadInput

RUN_TIMEOUT_S = 3600  # one side's selection: the tiny tier's suites take ~10 min on 2 cores
ORACLE_TIMEOUT_S = 1200


def _say(text: str) -> None:
    print(f"gate: {text}", file=sys.stderr, flush=True)


def cmd_gate(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _dry_run(args)
    from harness.gate import stacks as st
    from harness.gate.verdict import BROKEN, bisect, compare, oracle_test

    installed = st.installed_versions()
    a = st.parse_stack(args.from_stack, "--from", installed)
    b = st.parse_stack(args.to_stack, "--to", installed)
    moves = st.moved(a, b, installed)
    selection = shlex.split(args.select or "")
    out = Path(args.report_dir)
    timings: dict[str, float] = {}
    _say(f"{len(moves)} package(s) move: " + (", ".join(f"{n} {va} -> {vb}" for n, (va, vb) in moves.items())
                                              or "none"))
    def ready(stack):
        """(the stack's environment, its overlay, whether it was cached); StackSkip when it cannot be built."""
        overlay, cached = st.build(stack)
        return st.environment(overlay, stack.versions(installed).get("verl")), overlay, cached

    reports, configs = {}, {}
    for side, stack, option in (("A", a, "--from"), ("B", b, "--to")):
        started = time.monotonic()
        try:
            env, overlay, cached = ready(stack)
        except st.StackSkip as exc:
            raise BadInput(f"{option} {stack.label}: SKIP, the stack cannot be built: {exc}") from None
        timings[f"build_{side}_s"] = round(time.monotonic() - started, 1)
        _say(f"stack {side} ({stack.label}): " + ("the installed stack" if overlay is None else
                                                  f"overlay {overlay} ({'cached' if cached else 'built'}, "
                                                  f"{timings[f'build_{side}_s']} s)"))
        _say(f"running the selection on {side} (`run --scale tiny{' -- ' + args.select if args.select else ''}`)")
        started = time.monotonic()
        reports[side] = report = _run(env, out / side, selection, side == "A", option, side)
        timings[f"run_{side}_s"] = round(time.monotonic() - started, 1)
        configs[side] = _resolved(env)
        counts = report.counts if report else {}
        _say(f"{side}: " + (", ".join(f"{v} {k}" for k, v in counts.items() if v) if report else
                            "the run wrote no report (it crashed)") + f" in {timings[f'run_{side}_s']} s")
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
            started = time.monotonic()
            try:
                env, _, _ = ready(st.combine(a, b, names))
            except st.StackSkip as exc:
                return None, str(exc), time.monotonic() - started
            code = _pytest(env, [oracle])
            result = None if code in (4, 5) else code != 0
            _say(f"  A + {', '.join(sorted(names))}: " + {True: "reproduces", False: "passes",
                                                          None: f"SKIP (pytest exit {code})"}[result])
            return result, f"pytest exit {code}", time.monotonic() - started

        started = time.monotonic()
        bisection = bisect(list(moves), reproduces)
        timings["bisect_s"] = round(time.monotonic() - started, 1)
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


def _run(env: dict, report_dir: Path, selection: list[str], reference: bool, option: str, label: str):
    """`run --scale tiny [-- selection]` on one stack; its RunReport, or None when it wrote none (a crash on B)."""
    from harness.cli.run_cmd import CHECKOUT
    from harness.report.schema import load_report

    argv = [sys.executable, "-m", "harness.cli", "run", "--scale", "tiny", "--report-dir", str(report_dir)]
    # run's own progress (one line per finished test, a heartbeat: its output to a pipe) goes on, prefixed
    with subprocess.Popen([*argv, "--", *selection] if selection else argv, env={**env, "COLUMNS": "120"},
                          cwd=CHECKOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                if line.strip():
                    print(f"  {label}: {line.rstrip()[:200]}", file=sys.stderr, flush=True)
        finally:
            watchdog.cancel()
    path = report_dir / "report.json"
    if not path.is_file():
        if reference:
            raise BadInput(f"{option}: the selection wrote no report on the reference stack A "
                           f"({report_dir}/pytest.log says why)")
        return None
    return load_report(path)


def _pytest(env: dict, nodeids: list[str]) -> int:
    from harness.cli.run_cmd import CHECKOUT

    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--scale", "tiny",
                               *nodeids], env=env, cwd=CHECKOUT, timeout=ORACLE_TIMEOUT_S,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    except subprocess.TimeoutExpired:
        return 124


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
    from xml.etree import ElementTree as ET

    comparison = doc["comparison"] or {"broken": [], "flipped": [], "config": []}
    failures = len(comparison["broken"]) + (doc["state"] == "BROKEN")
    suite = ET.Element("testsuite", name="gate", tests=str(1 + len(comparison["broken"])), failures=str(failures))
    case = ET.SubElement(suite, "testcase", classname="gate", name=f"{doc['from']} -> {doc['to']}")
    if doc["state"] == "BROKEN":
        ET.SubElement(case, "failure", message=doc.get("named") or "BROKEN").text = json.dumps(comparison["broken"])
    for row in comparison["broken"]:
        broke = ET.SubElement(suite, "testcase", classname="gate.broken", name=row["test"])
        ET.SubElement(broke, "failure", message=f"{row['a']} on A, {row['b']} on B").text = row["reason_b"]
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
    print(_markdown(doc), end="")
    print(f"{doc['state']}: {doc['from']} -> {doc['to']}" + (f"; broke: {doc['named']}" if doc.get("named") else "")
          + f" (report {doc['reports']['B'].rsplit('/', 1)[0]}/gate.json)")


def _dry_run(args: argparse.Namespace) -> int:
    """Two NPU stack rows: what moves and which known-bug verdicts change; nothing installed."""
    from harness.config.known_bugs import KNOWN_BUGS, check, in_range, stack_row

    def affected(bug, versions: dict) -> str:
        """Whether the stack holds the row's components at affected versions: affected / not affected / absent."""
        ranges = ((bug.component, bug.affected), *bug.also)
        if any(versions.get(name) is None for name, _ in ranges):
            return "absent"
        return "affected" if all(not spec or in_range(versions[name], spec) for name, spec in ranges) else "clear"

    def versions(name: str, option: str) -> dict:
        row = stack_row(name, option)
        return {"python": row.python, **{p.name: p.version for p in row.pins}}

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
