"""`ascend-rl-harness report`: report JSON(s) -> HTML + Markdown; several (or a trend store) -> the trend page
with regression detection. Exit 1 when the newest report failed or a regression shows, 2 on bad input (one
line naming the file and field: a report of the wrong shape never ends in a traceback)."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import BadInput


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from harness.io import file_kind, write_atomic
    from harness.report.publish import distinct_names, load_store, page_stems, write_trend
    from harness.report.render import render_html, render_markdown
    from harness.report.schema import load_report

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o {out}: is a file; pass a directory for the pages")
    for given in args.results:  # a FIFO would block the read, /dev/zero never end it
        kind = file_kind(given)
        if kind not in (None, "regular file", "directory"):
            raise BadInput(f"{given}: a {kind}, not a report JSON or trend-store directory")
    console = Console()
    reports = []
    for given in args.results:
        # a trend-store directory quarantines a corrupt entry and goes on; a file named on purpose must load
        reports += load_store(given, warn=console.print) if Path(given).is_dir() else [load_report(given)]
    if not reports:
        raise BadInput(f"{' '.join(args.results)}: no report JSON there; pass report.json files or a trend-store "
                       "directory")
    reports.sort(key=lambda r: r.created)
    reports = distinct_names(reports)
    pages: dict[str, str] = {}
    # one path component each, bounded, distinct: a name `../../x` stays inside -o (issue 16)
    for i, (report, stem) in enumerate(zip(reports, page_stems([r.name for r in reports]), strict=True)):
        pages[report.name] = f"{stem}.html"
        write_atomic(out / f"{stem}.html", render_html(report, reports[i - 1] if i else None,
                                                       {"trend": "trend.html"} if len(reports) > 1 else {},
                                                       strict=True))
        write_atomic(out / f"{stem}.md", render_markdown(report))
        console.print(f"{'[green]PASS' if report.passed else '[red]FAIL'}[/] {escape(report.name)}: "
                      f"{escape(str(out / (stem + '.html')))}")
    failed = not reports[-1].passed  # the newest run decides, with any regression across the trend
    if len(reports) > 1:
        steps = write_trend(reports, out, args.tolerance, pages)
        for s in steps:
            color = "red" if s.regression else "green"
            console.print(f"[{color}]{'regression' if s.regression else 'improvement'}[/] {escape(s.metric)}: "
                          f"{s.before:.4g} -> {s.after:.4g} ({s.change:+.1%}) from {escape(s.report)}")
        console.print(f"trend: {escape(str(out / 'trend.html'))}")
        failed = failed or any(s.regression for s in steps)
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import fraction

    p = sub.add_parser("report", help="render report JSON(s) to HTML + Markdown; several: trend + regressions")
    p.add_argument("results", nargs="+", metavar="RESULT_JSON",
                   help="report JSON files, or trend-store directories (their *.json)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--tolerance", type=fraction, default=0.05, help="relative change that counts as a step")
    p.set_defaults(func=cmd_report)
