"""`ascend-rl-harness report`: report JSON(s) -> HTML + Markdown; several (or a trend store) -> the trend page
with regression detection. Exit 1 when the newest report failed or a regression shows, 2 on bad input."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import BadInput


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from harness.io import write_atomic
    from harness.report.publish import expand, write_trend
    from harness.report.render import render_html, render_markdown
    from harness.report.schema import load_report

    paths = expand(args.results)
    if not paths:
        raise BadInput(f"{' '.join(args.results)}: no report JSON there; pass report.json files or a trend-store "
                       "directory")
    loaded = sorted(((p, load_report(p)) for p in paths), key=lambda pr: pr[1].created)
    out = Path(args.output)
    console = Console()
    for path, report in loaded:
        stem = path.stem if path.stem != "report" else report.name
        write_atomic(out / f"{stem}.html", render_html(report))
        write_atomic(out / f"{stem}.md", render_markdown(report))
        console.print(f"{'[green]PASS' if report.passed else '[red]FAIL'}[/] {escape(report.name)}: "
                      f"{escape(str(out / (stem + '.html')))}")
    failed = not loaded[-1][1].passed  # the newest run decides, with any regression across the trend
    if len(loaded) > 1:
        steps = write_trend([r for _, r in loaded], out, args.tolerance)
        for s in steps:
            color = "red" if s.regression else "green"
            console.print(f"[{color}]{'regression' if s.regression else 'improvement'}[/] {escape(s.metric)}: "
                          f"{s.before:.4g} -> {s.after:.4g} ({s.change:+.1%}) from {escape(s.report)}")
        console.print(f"trend: {out / 'trend.html'}")
        failed = failed or any(s.regression for s in steps)
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render report JSON(s) to HTML + Markdown; several: trend + regressions")
    p.add_argument("results", nargs="+", metavar="RESULT_JSON",
                   help="report JSON files, or trend-store directories (their *.json)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--tolerance", type=float, default=0.05, help="relative change that counts as a step")
    p.set_defaults(func=cmd_report)
