"""pytest side of the report: with `--report-dir DIR`, collect every test's outcome, reason,
`record_property` measurements and pytest-benchmark stats, and at the end write DIR/report.json
(+ report.html, report.md). Registered by harness.plugin when --report-dir is given.

Works under xdist: outcomes and user_properties travel to the controller inside the test reports, and
only the controller writes the report. Benchmark stats are read from the `benchmark` fixture on the
worker and ride along as the `benchmark` user property (pytest-benchmark disables timing under xdist,
so those runs carry none).

The report is written as one new set (harness.report.publish.Generation) and swapped in only when the session
ran to its end: an interrupted session (Ctrl-C, SIGTERM) keeps the previous set whole, and a test whose call
phase never ran is no outcome (an interrupt mid-test recorded it passed). Everything kept goes through
harness.redact (a command line, a failure message or a property may hold a token).
"""
from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import pytest

from harness.errors import BadInput
from harness.io import exclusive
from harness.markers import REPORTED_MARKERS, SCALE_KEY
from harness.redact import redact, redact_argv, redact_doc
from harness.report.failures import shorten_funcargs
from harness.report.publish import EVIDENCE_PROPERTY
from harness.report.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    RunReport,
    TestVerdict,
    git_commit,
    machine_info,
    now_utc,
    report_name,
)

BENCHMARK_PROPERTY = "benchmark"
TAIL_CHARS = 20_000  # of a failure's traceback and captured log: the end is where the error is
_SEVERITY = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 2, "failed": 3, "error": 4}


def _jsonable(value):
    """record_property accepts anything; the report keeps JSON, and says so for the rest."""
    try:
        json.dumps(value, allow_nan=False)
        return redact_doc(value)
    except (TypeError, ValueError):
        return {"unserializable": redact(repr(value)[:500])}


# pytest's temporary directories (_pytest/tmpdir.py: <tmp>/pytest-of-<user>/pytest-<N>): a host's path, gone after
# the run, that a curves warning carried into the report (newcomer review, round 5)
_PYTEST_TMP = re.compile(r"(?:/[^\s'\"]*)?/pytest-of-[^/\s'\"]+/pytest-\d+")


def without_host_paths(value, root: str):
    """`value` (a property, a reason) with the checkout's absolute path made relative and pytest's temporary
    directory named `<pytest tmp>`: the report is shared, and read on other hosts (an msprobe row carried the
    checkout's absolute path)."""
    if isinstance(value, str):
        return _PYTEST_TMP.sub("<pytest tmp>", value.replace(root.rstrip("/") + "/", ""))
    if isinstance(value, dict):
        return {k: without_host_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [without_host_paths(v, root) for v in value]
    return value


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(report.longrepr)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return (lines[0] if lines else "failed")[:2000]
    return ""


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "skipped" if report.skipped else "passed"


class ReportCollector:
    """Accumulates per-test verdicts; writes and renders the run report at session end."""

    def __init__(self, config: pytest.Config, report_dir: str):
        self.config = config
        self.root = str(config.rootpath)
        self.report_dir = Path(report_dir)
        self.tests: dict[str, dict] = {}
        self.started = time.monotonic()
        self.path: Path | None = None
        self.error: BadInput | None = None  # the set could not be written (a full or read-only disk)
        self.interrupted = False  # a signal (Ctrl-C, SIGTERM) stopped the session: its report is incomplete
        self.lock = contextlib.ExitStack()
        if not hasattr(config, "workerinput"):  # the controller writes; two sessions on one directory must not
            try:
                self.lock.enter_context(exclusive(self.report_dir, "this report directory"))
            except BadInput as exc:
                raise pytest.UsageError(str(exc)) from None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.lock.close()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        # Before the report is built (on the worker under xdist): attach the benchmark fixture's stats.
        if call.when == "call":
            bench = getattr(item, "funcargs", {}).get("benchmark")
            stats = getattr(bench, "stats", None)
            if stats is not None and getattr(stats, "stats", None) is not None and stats.stats.data:
                doc = stats.as_dict(include_data=False)
                item.user_properties.append((BENCHMARK_PROPERTY, _jsonable(
                    {"name": doc["name"], "fullname": doc["fullname"], "group": doc["group"],
                     "extra_info": doc["extra_info"], "stats": doc["stats"]})))
        outcome = yield
        report = outcome.get_result()
        if report.failed:  # before anyone renders it: fixture reprs cut, tensors by shape/dtype (issue 33)
            shorten_funcargs(report.longrepr, getattr(item, "funcargs", {}))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(report.nodeid, {
            "outcome": "passed", "duration_s": 0.0, "reason": "", "properties": {}, "markers": (), "decided": False})
        entry["duration_s"] += report.duration
        # a passed setup decides nothing: the test has an outcome once its call ran, or a phase skipped or failed
        entry["decided"] |= report.when == "call" or not report.passed
        outcome = _outcome(report)
        if _SEVERITY[outcome] > _SEVERITY[entry["outcome"]]:  # the worst phase decides (setup error > call fail)
            entry["outcome"], entry["reason"] = outcome, without_host_paths(redact(_reason(report)), self.root)
        if report.failed:  # the report page shows each failure's traceback and captured log
            entry["traceback"] = redact(report.longreprtext[-TAIL_CHARS:])
            entry["log"] = redact("\n".join(f"----- {name} -----\n{text}"
                                             for name, text in report.sections)[-TAIL_CHARS:])
        for name, value in report.user_properties:
            # the evidence property names the run directory to copy (keep_evidence, which replaces it with the
            # copy's relative path): redacted to `<pytest tmp>/...`, it named nothing and the copy was empty
            entry["properties"][name] = _jsonable(value) if name == EVIDENCE_PROPERTY \
                else without_host_paths(_jsonable(value), self.root)
        keywords = getattr(report, "keywords", {}) or {}
        entry["markers"] = tuple(sorted(k for k in keywords if k in REPORTED_MARKERS))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A suite that fails to import is a failed verdict, not an absent one.
        if report.failed:
            lines = [line for line in str(report.longrepr).strip().splitlines() if line.strip()]
            self.tests[report.nodeid or "<collection>"] = {
                "outcome": "error", "duration_s": 0.0, "decided": True,
                "reason": redact(f"collection failed: {lines[-1] if lines else ''}"[:2000]),
                "properties": {}, "markers": (), "traceback": redact(report.longreprtext[-TAIL_CHARS:])}

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        # pytest raises Session.Interrupted for errors during collection: that session's report is complete
        self.interrupted = not isinstance(excinfo.value, pytest.Session.Interrupted)

    def outcomes(self) -> dict[str, str]:
        """nodeid -> outcome of every test that has one (see pytest_runtest_logreport)."""
        return {nodeid: e["outcome"] for nodeid, e in self.tests.items() if e["decided"]}

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller writes the report
            return
        from harness.report.publish import Generation, publish, staged_for

        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        say = reporter.write_line if reporter is not None else print
        if self.interrupted:
            say(f"ascend-rl-harness: the session was interrupted; {self.report_dir} keeps the previous report")
            return
        generation = staged_for(self.report_dir)  # `run` commits the set itself, with pytest.log and the trend
        own = generation is None
        try:
            generation = generation or Generation(self.report_dir)
            self.path = publish(self.build(int(exitstatus)), generation.path)
            if own:
                generation.commit()
                self.path = self.report_dir / self.path.name
        except BadInput as exc:  # a full or read-only disk: one line, the previous set kept
            if own and generation is not None:
                generation.discard()
            self.error, self.path = exc, None
            say(f"ascend-rl-harness: error: {exc}")
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def build(self, exit_status: int) -> RunReport:
        scale = self.config.stash.get(SCALE_KEY, None)
        commit, dirty = git_commit(self.config.rootpath)
        tests = []
        for nodeid, e in self.tests.items():
            if not e["decided"]:
                continue
            props = dict(e["properties"])
            bench = props.pop(BENCHMARK_PROPERTY, None)
            tests.append(TestVerdict(nodeid=nodeid, outcome=e["outcome"], duration_s=round(e["duration_s"], 3),
                                     reason=e["reason"], markers=e["markers"], properties=props, benchmark=bench,
                                     traceback=e.get("traceback", ""), log=e.get("log", "")))
        created = now_utc()
        return RunReport(
            schema=SCHEMA, schema_version=SCHEMA_VERSION, created=created,
            name=report_name(scale.name if scale else "tests", created),
            commit=commit, dirty=dirty, scale=scale.name if scale else None, plan=_plan_doc(scale, self.config),
            command=tuple(redact_argv(self.config.invocation_params.args)), machine=machine_info(), tests=tuple(tests),
            duration_s=round(time.monotonic() - self.started, 2), exit_status=exit_status,
            paths=tuple(redact_argv([str(a) for a in self.config.args])), job=job_doc(self.config))


def _plan_doc(scale, config) -> dict | None:
    """The plan of the job the tier ran, as `ascend-rl-harness plan --json [--recipe FILE]` prints it (one source:
    model, plan, overrides): with --recipe the team's job (harness.config.job.build_job: at tiny its rehearsal, at
    reduced its reduction), never the scale's built-in job beside a night that ran another."""
    if scale is None:
        return None
    from harness.config.recipe import plan_document

    if not config.getoption("recipe", None):
        return plan_document(scale)
    from harness.config.job import build_job
    from harness.config.user_recipe import parse_recipe_env, read_recipe

    try:
        user = read_recipe(config.getoption("recipe"), (), parse_recipe_env(config.getoption("recipe_env", None) or ()))
        job = build_job(scale, user, model_path=config.getoption("model_path", None))
    except BadInput:
        return None  # the plugin refused this recipe before any test ran (a usage error); no plan to show
    return redact_doc(plan_document(job.scale, recipe=job.recipe))  # its exports can hold a token, as plan's do


def _sha256(path: str | None) -> str | None:
    import hashlib

    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (OSError, TypeError):  # None, a directory of goldens, or gone since the session started
        return None


def job_doc(config) -> dict | None:
    """What a night ran and judged against (issue 45): --recipe (its path and content hash, and the names of
    --recipe-env's variables, never their values: a recipe's environment can hold a token), --model-path, and the
    golden (--baseline, which `run --golden` passes) with its hash. None for the scale's own job and golden."""
    recipe, golden = config.getoption("recipe", None), config.getoption("baseline", None)
    if not recipe and not golden:
        return None
    return redact_doc({"recipe": recipe and str(Path(recipe).resolve()), "recipe_sha256": _sha256(recipe),
            "recipe_env": [item.partition("=")[0] for item in config.getoption("recipe_env", None) or ()],
            "model_path": config.getoption("model_path", None), "golden": golden and str(Path(golden).resolve()),
            "golden_sha256": _sha256(golden)})
