"""`ascend-rl-harness run --scale tiny [--report-dir DIR]`: the main job.

Runs the scale's suites (`pytest suites -m <tier> --scale <scale> --report-dir DIR`) in this process
with a rich progress bar on a terminal, or one line per finished test and a heartbeat when stdout is no
terminal (CI logs), then reads the report the collector wrote (JSON + HTML + Markdown), prints a
verdict table and the report's path. Exit 0 only if every test that ran passed (skips with their reason are
allowed: a CPU machine has no NPU; zero tests is a failure) and, with --history, no regression shows across the
stored reports; 1 otherwise, 2 on bad input.

Nothing of the previous run is lost or mixed in: the report directory is locked for the run (a second run on
it is refused with one line); the new report set -- report.json/.html/.md, pytest.log and with --history the trend
pages -- is written into a fresh generation directory and swapped in with one rename only when it is complete
(harness.report.publish.Generation), so an interrupt (130 on SIGINT, 143 on SIGTERM), a full or read-only disk
(exit 2, one line) or a kill at any moment leaves the previous set whole; the verdict printed is always this run's
report, never one left in the directory.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.markup import escape

from harness.errors import BadInput

SUITES_DIR = "suites"
# Where an installed wheel keeps the suites: the checkout's root as a directory beside `harness` (pyproject.toml
# [tool.setuptools]); `run` from a team's image with no checkout runs these.
BUNDLE_DIR = "ascend_rl_harness_suites"
CACHE_DIR = ".pytest_cache"  # pytest's cache (--lf, --ff, --sw), kept per report directory
# The checkout this harness is imported from (an editable install, or PYTHONPATH at a clone): where `run` finds
# suites/ when the working directory is outside every clone.
CHECKOUT = Path(__file__).resolve().parents[2]
MAX_WORKERS = 1024  # xdist starts one interpreter per worker: 10**30 of them is no request
HEARTBEAT_S = 60.0  # a line at least this often when stdout is no terminal: CI kills jobs silent for long


class _Lines:
    """pytest plugin for a non-terminal stdout (CI logs): one line per finished test with its own duration (setup,
    call and teardown, as pytest's --durations counts it; the time since the start read as the test's), and, from
    a thread, a heartbeat naming the running test, so a log shows progress without a progress bar's control
    codes."""

    def __init__(self, out, heartbeat_s: float):
        self.out, self.heartbeat_s = out, heartbeat_s
        self.total, self.done, self.started, self.running = "?", 0, time.monotonic(), None
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.outcome: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.thread = threading.Thread(target=self._beat, name="run-heartbeat", daemon=True)

    def _line(self, text: str) -> None:
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _beat(self) -> None:
        while not self.stop.wait(self.heartbeat_s):
            running = f"; running {self.running[0]} for {time.monotonic() - self.running[1]:.0f} s" \
                if self.running else ""
            self._line(f"... {time.monotonic() - self.started:.0f} s: {self.done}/{self.total} done{running}")

    def pytest_sessionstart(self, session) -> None:
        self.thread.start()

    def pytest_sessionfinish(self, session) -> None:
        self.stop.set()

    def pytest_collection_finish(self, session) -> None:
        self.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.total = len(ids)

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.running = (nodeid, time.monotonic())

    def pytest_runtest_logreport(self, report) -> None:
        worst = self.outcome.get(report.nodeid)
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.outcome[report.nodeid] = "FAILED" if report.when == "call" else "ERROR"
        elif report.skipped and worst is None:
            self.outcome[report.nodeid] = "XFAIL" if hasattr(report, "wasxfail") else "SKIPPED"
        elif report.when == "call" and worst is None:
            self.outcome[report.nodeid] = "XPASS" if hasattr(report, "wasxfail") else "PASSED"
        if report.when == "teardown":
            self.done += 1
            self._line(f"[{self.done}/{self.total}] {self.outcome.pop(report.nodeid, 'PASSED')} {report.nodeid} "
                       f"({self.seconds.pop(report.nodeid, 0.0):.1f} s)")


class _Progress:
    """pytest plugin: one rich progress bar advanced per finished test, the failing ones named as they happen."""

    def __init__(self, progress, console):
        self.progress, self.console, self.task = progress, console, None

    def pytest_collection_finish(self, session) -> None:
        self.task = self.progress.add_task("tests", total=len(session.items))

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown (and unused) without xdist
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        # Under xdist the controller collects nothing itself; every worker reports the same ids.
        if self.task is None:
            self.task = self.progress.add_task("tests", total=len(ids))
        else:
            self.progress.update(self.task, total=len(ids))

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.console.print(f"[red]{'FAILED' if report.when == 'call' else 'ERROR'}[/] {escape(report.nodeid)}")
        if report.when == "teardown" and self.task is not None:
            self.progress.update(self.task, advance=1, description=report.nodeid.rsplit("::", 1)[-1][:60])


def project_root(start: Path | None = None) -> Path:
    """The checkout whose suites `run` runs: the working directory or the nearest directory above it that holds
    suites/ (as git finds .git), else the checkout the harness is imported from, else the suites installed with it
    (BUNDLE_DIR, beside the package in site-packages). BadInput saying where to run otherwise (`run` from any other
    directory said only "no suites/ here")."""
    start = (start or Path.cwd()).resolve()
    for directory in (start, *start.parents, CHECKOUT, CHECKOUT / BUNDLE_DIR):
        if (directory / SUITES_DIR).is_dir():
            return directory
    raise BadInput(f"no {SUITES_DIR}/ in {start} or any directory above it, nor beside the harness ({CHECKOUT}); run "
                   "inside a clone of ascend-rl-harness (its root holds suites/ and pyproject.toml), or install the "
                   "harness from one (pip install -e CLONE)")


def pytest_args(scale: str, tier: str, report_dir: Path, workers: int, extra: list[str],
                root: Path | None = None) -> list[str]:
    """The pytest command line the job runs (also printed, so a failure can be rerun by hand). pytest's cache lives
    in the report directory: `run --report-dir D -- --lf` reruns what failed in D's previous run, `--ff` and
    `--sw` work the same way. `root`: the checkout (its suites/, and --rootdir, so node ids read `suites/...`
    from any working directory)."""
    suites = str(root / SUITES_DIR) if root is not None else SUITES_DIR
    # `run -- suites/x.py` (a file, directory or node id of the suites) runs what it names: pytest given both
    # collected every suite as well (30-40 s of imports for each gate side and bisection step)
    named = any(_under(arg, Path(suites)) for arg in extra if not arg.startswith("-"))
    args = [*([] if named else [suites]), "-m", tier, "--scale", scale, "--report-dir", str(report_dir),
            "-o", f"cache_dir={Path(report_dir).absolute() / CACHE_DIR}"]
    if root is not None:
        args += ["--rootdir", str(root)]
    if workers > 1:
        args += ["-p", "xdist", "-n", str(workers)]
    return args + extra


def _under(arg: str, suites: Path) -> bool:
    """`arg` is a path (or node id) of a test under `suites`, as pytest resolves it: from the working directory."""
    path = Path(arg.split("::", 1)[0])
    try:
        return path.exists() and path.resolve().is_relative_to(suites.resolve())
    except (OSError, ValueError):
        return False


class _Session:
    """pytest plugin: keeps the config, so the runner reads the report *this* session's collector wrote, and the
    interrupt that stopped the session (pytest turns it into exit status INTERRUPTED)."""

    config = None
    interrupt: KeyboardInterrupt | None = None

    def pytest_configure(self, config) -> None:
        self.config = config

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        if not isinstance(excinfo.value, pytest.Session.Interrupted):  # that one: errors during collection
            self.interrupt = excinfo.value

    def collector(self):
        return self.config.pluginmanager.get_plugin("harness-report") if self.config else None

    def written(self) -> Path | None:
        return getattr(self.collector(), "path", None)


class _Log(io.TextIOBase):
    """pytest.log as pytest writes it: the first failed write (a full disk) is kept and every later one dropped,
    so the session runs to its end instead of an INTERNALERROR written into the same full file; the runner then
    refuses the set with one line naming the log."""

    def __init__(self, path: Path):
        self.path, self.error = path, None
        self.file = open(path, "x", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115 -- closed by close()

    def write(self, text: str) -> int:
        if self.error is None and not self.file.closed:
            try:
                self.file.write(text)
            except OSError as exc:
                self.error = exc
        return len(text)

    encoding, errors = "utf-8", "backslashreplace"

    def flush(self) -> None:
        if self.error is None and not self.file.closed:
            try:
                self.file.flush()
            except OSError as exc:
                self.error = exc

    def fileno(self) -> int:  # faulthandler dups stderr's descriptor
        return self.file.fileno()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if self.file.closed:
            return
        try:
            self.flush()
            if self.error is None:
                os.fsync(self.file.fileno())
        except OSError as exc:
            self.error = self.error or exc
        finally:
            try:
                self.file.close()
            except OSError as exc:
                self.error = self.error or exc


# pytest options the runner sets itself (pytest_args): given again after `--`, pytest's last one won, so
# `run --report-dir A -- --report-dir B` wrote B while A's previous report was swapped out and the JSON named A's
# files. The team's job (issue 45) is `run`'s own flags too, checked before the report directory is touched; pytest's
# --baseline is `run --golden`.
JOB_OPTIONS = {"--recipe": "--recipe", "--recipe-env": "--recipe-env", "--model-path": "--model-path",
               "--golden": "--baseline"}  # run's flag -> the plugin's option (harness.plugin)
OWNED_OPTIONS = {"--report-dir": "--report-dir", "--scale": "--scale",
                 **{pytest_option: flag for flag, pytest_option in JOB_OPTIONS.items()}}


def _refuse_owned_options(extra: list[str]) -> None:
    for word in extra:
        option = word.partition("=")[0]
        if option in OWNED_OPTIONS:
            flag = OWNED_OPTIONS[option]
            raise BadInput(f"{option} after `--`: `run` sets it itself; pass `run {flag} ...` before the `--`")


def job_options(args: argparse.Namespace, scale) -> tuple[list[str], list[str]]:
    """The pytest options of `run --recipe/--recipe-env/--model-path/--golden`, each checked as the plugin checks it
    (BadInput, one line, exit 2): a recipe the launcher would refuse, a golden that is not there; and at the reduced
    tier the lines of what bringing the recipe up on one node changes (harness.config.job.reduce), for the console."""
    from harness.cli.args import recipe_from_args
    from harness.plugin import check_input_path

    if (args.recipe_env or args.model_path) and not args.recipe:
        given = "--recipe-env" if args.recipe_env else "--model-path"
        raise BadInput(f"{given} without --recipe: it is an input of your recipe; pass --recipe FILE")
    user = recipe_from_args(args)
    lines = []
    if user is not None and scale.tier == "reduced":
        from harness.config.job import build_job

        job = build_job(scale, user, model_path=args.model_path)
        lines = [f"--recipe {user.source} at scale {scale.name}: {len(job.reduction)} change(s)",
                 *(c.line() for c in job.reduction)]
    if args.golden is not None:
        check_input_path("--golden", args.golden)
    out = ["--recipe", args.recipe] if args.recipe else []
    out += [f"--recipe-env={item}" for item in args.recipe_env]
    out += ["--model-path", args.model_path] if args.model_path else []
    return out + (["--baseline", args.golden] if args.golden is not None else []), lines


def cmd_run(args: argparse.Namespace) -> int:
    from harness.cli.args import scale_arg
    from harness.io import exclusive
    from harness.plugin import check_report_dir
    from harness.report.publish import check_store, staged

    scale = scale_arg(args.scale)
    root = project_root()
    _refuse_owned_options(args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args)
    job = job_options(args, scale)
    report_dir = check_report_dir(args.report_dir)
    if args.history:
        check_store(args.history)
    with exclusive(report_dir, "this report directory"), staged(report_dir) as generation:
        return _run_locked(args, scale, root, report_dir, generation, job)


def _run_locked(args: argparse.Namespace, scale, root: Path, report_dir: Path, generation,
                job: tuple[list[str], list[str]]) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from harness.cli.output import console as output_console
    from harness.io import write_error
    from harness.redact import redact_argv
    from harness.report.failures import rerun_failed
    from harness.report.publish import JUNIT_NAME, LOG_NAME, load_store, publish, store, write_trend
    from harness.report.render import counts_text
    from harness.report.schema import load_report
    from harness.report.trend import lost

    extra = job[0] + (args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args)
    argv = pytest_args(scale.name, scale.tier, report_dir, args.workers, extra, root)
    # The progress output writes to a duplicate of the terminal's fd: pytest's fd capture redirects fd 1
    # while tests run, and its own terminal report goes to the log. With --json it is stderr's: stdout carries only
    # the JSON.
    shown_on = sys.stderr if args.json else sys.stdout
    try:
        terminal = os.fdopen(os.dup(shown_on.fileno()), "w", buffering=1)
    except (AttributeError, OSError, io.UnsupportedOperation):  # stdout is no file (captured, in a test)
        terminal = shown_on
    # as wide as the terminal, or $COLUMNS even when stdout is a log or a pipe (harness.cli.output.console; `run`
    # once printed 200 columns into every CI log and ignored COLUMNS)
    console = output_console(stderr=args.json, file=terminal)
    log, new_log = report_dir / LOG_NAME, generation.path / LOG_NAME
    shown = " ".join(redact_argv(argv))  # the console and CI logs are shared: no token from --ray-address
    console.print(f"[bold]ascend-rl-harness run[/] scale {escape(scale.name)}: pytest {escape(shown)}")
    for line in job[1]:  # the recipe at reduced layers: each change, never folded (a line to grep for)
        console.print(escape(line), soft_wrap=True)
    session = _Session()
    # stderr too: pytest's usage errors go there, and `run` says one line pointing at the log instead
    out = _Log(new_log)
    with contextlib.closing(out), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        if terminal.isatty():
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            # redirect_*=False: rich's default proxies sys.stdout through the live display, which sent pytest's
            # output to the terminal and left pytest.log empty on every terminal run
            with Progress(*columns, console=console, transient=True, redirect_stdout=False,
                          redirect_stderr=False) as progress:
                status = pytest.main(argv, plugins=[session, _Progress(progress, console)])
        else:
            status = pytest.main(argv, plugins=[session, _Lines(terminal, HEARTBEAT_S)])
    if session.interrupt is not None:  # Ctrl-C / SIGTERM: no new set; the CLI says so and exits 130 / 143
        raise session.interrupt
    if out.error is not None:
        raise write_error(log, out.error)
    collector = session.collector()
    if getattr(collector, "error", None) is not None:  # the report set could not be written (a full disk)
        raise collector.error
    written = session.written()
    if written is None:  # no report from this run: keep the previous report and its log as they were
        failed_log = new_log.replace(report_dir / "pytest-failed.log")
        raise BadInput(f"pytest {shown} exited with {getattr(status, 'name', status)} and wrote no report; "
                       f"see {failed_log}")
    if int(status) in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        failed_log = new_log.replace(report_dir / "pytest-failed.log")
        raise BadInput(f"pytest {shown} exited with {getattr(status, 'name', status)}; see {failed_log}")
    report = load_report(written)
    if args.verbose:  # every test, as a table; by default only the failures, as pytest's short summary
        table = Table(title=f"{report.name}: {'PASS' if report.passed else 'FAIL'}")
        table.add_column("test", overflow="fold", min_width=min(60, max((len(t.nodeid) for t in report.tests),
                                                                        default=4)))
        table.add_column("outcome", no_wrap=True)
        table.add_column("s", no_wrap=True, justify="right")
        table.add_column("reason", overflow="fold", ratio=1)  # the reason wraps, test names stay readable
        color = {"passed": "green", "skipped": "yellow", "xfailed": "yellow"}
        for t in sorted(report.tests, key=lambda t: (not t.failing, t.nodeid)):
            # escape: parametrized node ids ("test[vllm-dummy]") would otherwise be read as rich markup and vanish
            table.add_row(escape(t.nodeid), f"[{color.get(t.outcome, 'red')}]{t.outcome}[/]", f"{t.duration_s:.1f}",
                          escape(t.reason))
        console.print(table)
    for t in report.tests:
        if t.failing:
            console.print(escape(short_summary(t, console.width)), soft_wrap=True)
    regressed, trend_failures = [], []
    if args.history:  # nightly: keep this report in the trend store and look for steps across it
        earlier = load_store(args.history, warn=lambda line: console.print(f"[yellow]{escape(line)}[/]"))
        store(report, args.history)
        history = [*earlier, report]
        # the page again, now with the delta against the previous night and the link to the trend
        publish(report, generation.path, earlier[-1] if earlier else None, trend=True, history=earlier)
        steps = write_trend(history, generation.path, pages={report.name: "report.html"})
        regressed = [s for s in steps if s.regression]
        # what the night lost against the one before (tests, suites, metrics) fails it as a regression does
        newest = lost(history[-2:])[-1] if len(history) > 1 else None
        trend_failures = newest.reasons() if newest else []
    generation.commit()  # the whole set at once: the previous one stays until here
    c = report.counts
    passed = bool(report.tests) and report.passed and not regressed and not trend_failures
    if args.json:
        from harness.cli.output import emit, verdict

        state = ("NO TESTS" if not report.tests else "FAIL" if not report.passed else
                 "REGRESSED" if regressed else "LOST TESTS" if trend_failures else "PASS")
        return emit(verdict(passed, state, {
            "scale": scale.name, "report": report.name, "counts": c, "duration_s": report.duration_s,
            "exit_status": report.exit_status,
            "rerun": None if report.passed else rerun_failed(report),
            "failing": [{"nodeid": t.nodeid, "outcome": t.outcome, "reason": t.reason} for t in report.tests
                        if t.failing],
            "regressions": [dataclasses.asdict(s) for s in regressed], "lost": trend_failures,
            "files": {name: str((report_dir / name).absolute()) for name in
                      ("report.html", written.name, "report.md", JUNIT_NAME, LOG_NAME,
                       *(("trend.html",) if args.history else ()))}}))
    if not report.tests:
        console.print(f"[red]FAIL[/]: no {scale.tier} test ran (pytest exit status {report.exit_status}); a run "
                      "without tests is a failure")
        return 1
    verdict = "[green]PASS[/]" if report.passed else "[red]FAIL[/]"
    console.print(f"{verdict}: {counts_text(report)}")
    if not report.passed:  # the run's own command on exactly its failed node ids (harness.report.failures)
        # one line, never folded at the width (a command to copy, and a line tools grep for)
        console.print(f"rerun what failed: {escape(rerun_failed(report))}", soft_wrap=True)
    for s in regressed:
        console.print(f"[red]regression[/] {escape(s.metric)}: {s.before:.4g} -> {s.after:.4g} ({s.change:+.1%}) "
                      f"from {escape(s.report)}")
    for line in trend_failures:
        console.print(f"[red]FAIL[/] {escape(line)}")
    if args.history:
        console.print(f"trend over {escape(str(args.history))}: {(report_dir / 'trend.html').absolute()}",
                      soft_wrap=True)
    console.print(f"report: {(report_dir / 'report.html').absolute()} (JSON: {(report_dir / written.name).absolute()}, "
                  f"Markdown: {(report_dir / 'report.md').absolute()}, JUnit: {(report_dir / JUNIT_NAME).absolute()}, "
                  f"pytest log: {log.absolute()})", soft_wrap=True)  # paths: never folded mid-name
    return 0 if passed else 1


SUMMARY_WORDS = {"failed": "FAILED", "error": "ERROR", "xpassed": "XPASS"}


def short_summary(test, width: int) -> str:
    """pytest's short test summary line (`FAILED nodeid - E line`, _pytest/terminal.py _get_line_with_reprcrash_message)
    cut to `width` at a word, never inside a number (the 200-column table cut `worst |diff| 0.` mid-number); the node
    id is never cut: with no room left the line is just `FAILED nodeid`."""
    from harness.report.failures import e_line

    head = f"{SUMMARY_WORDS.get(test.outcome, test.outcome.upper())} {test.nodeid}"
    message = " ".join(e_line(test).split())
    if len(head) + len(" - ") + len(message) <= width:
        return f"{head} - {message}"
    room = width - len(head) - len(" - ") - len(" ...")
    kept = " ".join(message[:room + 1].split(" ")[:-1]) if room > 0 else ""  # the word across the edge goes
    return f"{head} - {kept} ..." if kept else head


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import add_recipe_env_argument, whole

    p = sub.add_parser("run", help="the main job: run a scale's suites and write the report (JSON + HTML + Markdown)")
    p.add_argument("--scale", default="tiny", help="scale to run (default tiny; see `scales`)")
    p.add_argument("--report-dir", default="reports", help="where report.json/.html/.md go (default reports/)")
    p.add_argument("--workers", type=whole(1, MAX_WORKERS), default=1,
                   help=f"pytest-xdist workers, 1-{MAX_WORKERS} (default 1)")
    p.add_argument("--history", metavar="DIR", help="trend store: add this report to DIR and write trend.html "
                                                    "(exit 1 on a regression across the stored reports)")
    p.add_argument("--json", action="store_true",
                   help="print JSON on stdout (progress goes to stderr): `passed`, `state` (PASS, FAIL, NO TESTS, "
                        "REGRESSED, LOST TESTS), the counts, failing tests and the report's files")
    p.add_argument("--verbose", action="store_true",
                   help="end with the table of every test (default: one `FAILED id - E line` per failure, as pytest)")
    p.add_argument("--recipe", metavar="FILE",
                   help="your verl job (a launch script or a Hydra YAML, as `plan --recipe` reads it): the tiers run "
                        "it instead of the scale's built-in job (tiny: rehearsed on verl's real trainer; reduced: "
                        "planned at reduced layers on one node; launched tiers: submitted as written)")
    add_recipe_env_argument(p)
    p.add_argument("--model-path", metavar="DIR",
                   help="with --recipe on a launched tier: the HF model directory on the cluster's shared storage "
                        "(default: the recipe's actor_rollout_ref.model.path, else the scale's)")
    p.add_argument("--golden", metavar="FILE", help="the golden to judge the curves against: a baseline file recorded "
                   "from your recipe's own runs (`baseline record RUN... -o FILE`), or a directory of them; pytest's "
                   "--baseline")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: extra pytest arguments")
    p.set_defaults(func=cmd_run)
