"""`ascend-rl-harness run --scale tiny [--report-dir DIR]`: the main job.

Runs the scale's suites (`pytest suites -m <tier> --scale <scale> --report-dir DIR`) in this process
with a rich progress bar (pytest's own terminal output goes to DIR/pytest.log), then reads the report
the collector wrote (JSON + HTML + Markdown), prints a verdict table and the report's path. Exit 0 only if
every test that ran passed (skips with their reason
are allowed: a CPU machine has no NPU) and, with --history, no regression shows across the stored
reports; 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

import pytest
from rich.markup import escape

from harness.errors import BadInput

SUITES_DIR = "suites"


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


def pytest_args(scale: str, tier: str, report_dir: Path, workers: int, extra: list[str]) -> list[str]:
    """The pytest command line the job runs (also printed, so a failure can be rerun by hand)."""
    args = [SUITES_DIR, "-m", tier, "--scale", scale, "--report-dir", str(report_dir), "-p", "no:cacheprovider"]
    if workers > 1:
        args += ["-p", "xdist", "-n", str(workers)]
    return args + extra


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from harness.cli.args import scale_arg
    from harness.report.schema import load_report

    scale = scale_arg(args.scale)
    if not Path(SUITES_DIR).is_dir():
        raise BadInput(f"no {SUITES_DIR}/ here ({Path.cwd()}); run from the ascend-rl-harness checkout")
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    argv = pytest_args(scale.name, scale.tier, report_dir, args.workers, extra)
    # The progress bar writes to a duplicate of the terminal's fd: pytest's fd capture redirects fd 1
    # while tests run, and its own terminal report goes to pytest.log.
    try:
        terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    except (AttributeError, OSError, io.UnsupportedOperation):  # stdout is no file (captured, in a test)
        terminal = sys.stdout
    # CI logs are no terminal: keep node ids and reasons on one line instead of folding them at 80 columns.
    console = Console(file=terminal, width=None if terminal.isatty() else 200)
    log = report_dir / "pytest.log"
    console.print(f"[bold]ascend-rl-harness run[/] scale {scale.name}: pytest {' '.join(argv)}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with open(log, "w", encoding="utf-8") as out, contextlib.redirect_stdout(out), \
            Progress(*columns, console=console, transient=True) as progress:
        status = pytest.main(argv, plugins=[_Progress(progress, console)])
    if int(status) in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        raise BadInput(f"pytest {' '.join(argv)} exited with {getattr(status, 'name', status)}; see {log}")
    if not (report_dir / "report.json").is_file():
        raise BadInput(f"pytest wrote no {report_dir / 'report.json'} (exit status {int(status)}); see {log}")
    report = load_report(report_dir / "report.json")
    table = Table(title=f"{report.name}: {'PASS' if report.passed else 'FAIL'}")
    for col in ("test", "outcome", "s", "reason"):
        table.add_column(col, overflow="fold")
    color = {"passed": "green", "skipped": "yellow", "xfailed": "yellow"}
    for t in sorted(report.tests, key=lambda t: (not t.failing, t.nodeid)):
        # escape: parametrized node ids ("test[vllm-dummy]") would otherwise be read as rich markup and vanish
        table.add_row(escape(t.nodeid), f"[{color.get(t.outcome, 'red')}]{t.outcome}[/]", f"{t.duration_s:.1f}",
                      escape(t.reason[:200]))
    console.print(table)
    c = report.counts
    if not report.tests:
        console.print(f"[red]FAIL[/]: no {scale.tier} test ran (pytest exit status {report.exit_status})")
        return 1
    verdict = "[green]PASS[/]" if report.passed else "[red]FAIL[/]"
    console.print(f"{verdict}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped "
                  f"in {report.duration_s:.1f} s")
    console.print(f"report: {(report_dir / 'report.html').resolve()} (JSON: {(report_dir / 'report.json').resolve()}, "
                  f"Markdown: {(report_dir / 'report.md').resolve()}, pytest log: {log.resolve()})")
    regressed = []
    if args.history:  # nightly: keep this report in the trend store and look for steps across it
        from harness.report.publish import expand, store, write_trend

        store(report, args.history)
        steps = write_trend([load_report(p) for p in expand([args.history])], report_dir)
        regressed = [s for s in steps if s.regression]
        for s in regressed:
            console.print(f"[red]regression[/] {escape(s.metric)}: {s.before:.4g} -> {s.after:.4g} ({s.change:+.1%}) "
                          f"from {escape(s.report)}")
        console.print(f"trend over {args.history}: {(report_dir / 'trend.html').resolve()}")
    return 0 if report.passed and not regressed else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the main job: run a scale's suites and write the report (JSON + HTML + Markdown)")
    p.add_argument("--scale", default="tiny", help="scale to run (default tiny; see `scales`)")
    p.add_argument("--report-dir", default="reports", help="where report.json/.html/.md go (default reports/)")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (default 1)")
    p.add_argument("--history", metavar="DIR", help="trend store: add this report to DIR and write trend.html "
                                                    "(exit 1 on a regression across the stored reports)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: extra pytest arguments")
    p.set_defaults(func=cmd_run)
