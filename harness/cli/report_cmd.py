"""`ascend-rl-harness report`: report JSON(s) -> HTML + Markdown; several (or a trend store) -> the trend page
with regression detection. `--last N` / `--since DATE` keep the newest nights. Exit 1 when the trend fails (the
newest report failed, lost tests, suites or metrics the one before had, or a regression shows), 2 on bad input
(one line naming the file and field: a report of the wrong shape never ends in a traceback). `--export tb|csv`
also writes the reports' curves for TensorBoard or as wandb CSV (harness.report.export); then the command is a
conversion and exits 0 once the export is written, the reports' verdict a field (`verdict`) of --json."""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from pathlib import Path

from harness.errors import BadInput


def since_arg(text: str) -> dt.datetime:
    """`--since`: an ISO date (2026-11-01, midnight UTC) or date and time (2026-11-01T02:00, UTC unless given)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be an ISO date, e.g. 2026-11-01 or "
                                         "2026-11-01T02:00:00+00:00") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def created_at(report) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(report.created)
    except ValueError:  # a hand-written `created`: kept by --since, never compared
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def select(reports: list, last: int | None, since: dt.datetime | None) -> list:
    """The nights --since and --last keep (oldest first): created at or after `since`, then the newest `last`."""
    if since is not None:
        reports = [r for r in reports if (created_at(r) or since) >= since]
    return reports[-last:] if last else reports


def cmd_report(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from harness.cli.output import console as output_console
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
    # one line per verdict in CI logs: paths and names are never folded; --json: stdout carries only the JSON
    console = output_console(stderr=args.json, soft_wrap=True)  # even at COLUMNS=80
    reports = []
    for given in args.results:
        # a trend-store directory quarantines a corrupt entry and goes on; a file named on purpose must load
        reports += load_store(given, warn=console.print) if Path(given).is_dir() else [load_report(given)]
    if not reports:
        raise BadInput(f"{' '.join(args.results)}: no report JSON there; pass report.json files or a trend-store "
                       "directory")
    reports.sort(key=lambda r: r.created)
    kept = select(reports, args.last, args.since)
    if not kept:
        raise BadInput(f"--since {args.since.isoformat()}: none of the {len(reports)} reports was created then or "
                       f"later (the newest: {reports[-1].created})")
    reports = distinct_names(kept)
    curves = None
    if args.export:  # checked before anything is written: a report without curves is bad input, not an empty export
        from harness.report import export

        curves = export.collect(reports)
        if not curves:
            raise BadInput(f"--export {args.export}: no curves in {' '.join(args.results)} (no test recorded "
                           "curves.series: the reward-alignment suite records them against a per-step golden)")
    pages: dict[str, str] = {}
    # one path component each, bounded, distinct: a name `../../x` stays inside -o
    for i, (report, stem) in enumerate(zip(reports, page_stems([r.name for r in reports]), strict=True)):
        pages[report.name] = f"{stem}.html"
        write_atomic(out / f"{stem}.html", render_html(report, reports[i - 1] if i else None,
                                                       {"trend": "trend.html"} if len(reports) > 1 else {},
                                                       strict=True, history=reports[:i]))
        write_atomic(out / f"{stem}.md", render_markdown(report))
        console.print(f"{'[green]PASS' if report.passed else '[red]FAIL'}[/] {escape(report.name)}: "
                      f"{escape(str(out / (stem + '.html')))}")
    exported = None
    if curves:
        exported = export.export(curves, out, args.export)
        where = out / export.FORMATS[args.export]
        console.print(f"exported {len(exported)} runs' curves ({sum(c.role == 'candidate' for c in curves)} "
                      f"candidate, {sum(c.role == 'reference' for c in curves)} reference) to {escape(str(where))}"
                      + (f" (tensorboard --logdir {escape(str(where))})" if args.export == "tb" else ""))
    failed = not reports[-1].passed  # the newest run decides, with what the trend across the nights says
    trend = None
    if len(reports) > 1:
        from harness.report.trend import verdict

        steps = write_trend(reports, out, args.tolerance, pages)
        for s in steps:
            color = "red" if s.regression else "green"
            console.print(f"[{color}]{'regression' if s.regression else 'improvement'}[/] {escape(s.metric)}: "
                          f"{s.before:.4g} -> {s.after:.4g} ({s.change:+.1%}) from {escape(s.report)}")
        passed, reasons = verdict(reports, steps)
        for reason in reasons:
            console.print(f"[red]FAIL[/] {escape(reason)}")
        console.print(f"trend over {len(reports)} nights: {'[green]PASS' if passed else '[red]FAIL'}[/] "
                      f"{escape(str(out / 'trend.html'))}")
        failed = failed or not passed
        trend = {"passed": passed, "reasons": reasons, "page": str(out / "trend.html"),
                 "steps": [dataclasses.asdict(s) for s in steps]}
    # `--export` is a conversion: it succeeded once the files are written, whatever the runs' verdict (a red night's
    # curves are the ones people load into TensorBoard); exiting 1 there read as "the export failed" (issue 33).
    # The reports' verdict stays in the output, as `verdict` in --json.
    exported_ok = exported is not None
    if args.json:
        from harness.cli.output import emit, verdict

        return emit(verdict(exported_ok or not failed, "EXPORTED" if exported_ok else "FAIL" if failed else "PASS", {
            "verdict": "FAIL" if failed else "PASS", "newest": reports[-1].name, "trend": trend,
            "export": {"format": args.export, "directory": str(out / export.FORMATS[args.export]),
                       "runs": exported} if exported else None,
            "reports": [{"name": r.name, "created": r.created, "passed": r.passed, "counts": r.counts,
                         "page": str(out / pages[r.name])} for r in reports]}))
    if exported_ok and failed:
        console.print("exported; the reports' verdict is [red]FAIL[/] (exit 0: --export succeeded)")
    return 0 if exported_ok or not failed else 1


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import fraction, whole

    p = sub.add_parser("report", help="render report JSON(s) to HTML + Markdown; several: trend + regressions")
    p.add_argument("results", nargs="+", metavar="RESULT_JSON",
                   help="report JSON files, or trend-store directories (their *.json)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--tolerance", type=fraction, default=0.05, help="relative change that counts as a step")
    p.add_argument("--last", type=whole(1), metavar="N", help="only the newest N reports")
    p.add_argument("--json", action="store_true", help="print JSON: `passed`, `state` (PASS / FAIL: the newest "
                                                       "report and the trend; EXPORTED with --export), `verdict` "
                                                       "(PASS / FAIL), each report's page and the trend")
    p.add_argument("--since", type=since_arg, metavar="DATE",
                   help="only reports created at or after DATE (ISO: 2026-11-01, or 2026-11-01T02:00 UTC)")
    p.add_argument("--export", choices=("tb", "csv"),
                   help="also write each report's curves (the candidate run and the golden's reference runs, as the "
                        "report recorded them) under -o: tb = TensorBoard event files in tensorboard/, csv = wandb's "
                        "CSV export layout in wandb-csv/; one run per directory / file, as compare and baseline "
                        "record read runs")
    p.set_defaults(func=cmd_report)
