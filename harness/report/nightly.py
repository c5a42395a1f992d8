"""The nightly NPU run's verdict lines: for every failing test of a tier's report.json, the suite, the metric
and the place (step, layer, phase) its findings name (harness.findings, recorded by the `expect` fixture), so
the morning mail reads `FAIL reduced-a2 suites/precision/test_reward_alignment.py::test_reward_curve metric
critic/rewards/mean step 12: ...`. A failing test with no finding (a crash, a plain assert) prints `-`.

`python -m harness.report.nightly [--summary FILE] REPORT...` prints them (after a `JOB` line naming the recipe and
the golden of a night on a team's recipe, issue 45), a `COST` line per cost ledger the run
recorded (card-hours used, saved by an early abort, wasted by a false one: harness.perf.ledger), and a `SYNC` line
per weight sync the Megatron sender suite timed, against the platform's per-phase budget (exit 1 when any test
failed or a sync phase went over its budget); used by
ci/nightly.sh after each tier. `--summary FILE` also appends each report's Markdown (a REPORT ending in `.md`, such
as a trend.md, is appended as it is) to FILE through harness.redact: GitHub's `$GITHUB_STEP_SUMMARY`, or any file
another CI shows.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from harness.errors import BadInput


@dataclass(frozen=True)
class Failure:
    scale: str
    suite: str  # the test file
    test: str
    metric: str  # "-" when the test recorded no finding
    where: str  # "step 12", "layer 1", "update stage 15"; "-" when the test recorded no finding
    reason: str

    def line(self) -> str:
        # one failure, one line: a reason or name holding newlines must not forge lines in the morning mail
        text = f"FAIL {self.scale} {self.suite}::{self.test} metric {self.metric} {self.where}: {self.reason}"
        return " ".join(text.split())


def failures(report) -> list[Failure]:
    """Failing tests of a harness RunReport: one line per finding the test recorded, or one with `-`."""
    out = []
    for t in report.tests:
        if not t.failing:
            continue
        suite, _, test = t.nodeid.partition("::")
        found = [f for f in t.findings if isinstance(f, dict)]
        for f in found or [{"metric": "-", "where": "-", "message": t.reason or t.outcome}]:
            out.append(Failure(scale=report.scale or "-", suite=suite, test=test or "-",
                               metric=str(f.get("metric", "-")), where=str(f.get("where", "-")),
                               reason=str(f.get("message") or t.reason or t.outcome)))
    return out


def ledger_lines(report) -> list[str]:
    """`COST <scale> <run>: N card-hours used ...` for every cost ledger the report's tests recorded
    (harness.perf.ledger, the "cost.ledger" property of the throughput suite)."""
    from harness.perf.ledger import from_json

    return [f"COST {report.scale or '-'} {from_json(doc).line()}" for _, doc in report.properties("cost.ledger")]


def append_summary(path: str, markdown: str) -> None:
    """Append `markdown` to the summary file `path` (created if absent), every credential masked: a step summary is
    shown to everyone who can read the workflow run."""
    from harness.io import WRITE_ERRNOS, write_error
    from harness.redact import redact

    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(redact(markdown).rstrip() + "\n\n")
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:
            raise write_error(path, exc) from None
        raise


USAGE = "usage: python -m harness.report.nightly [--summary FILE] REPORT_JSON|MARKDOWN..."


def main(argv: list[str] | None = None) -> int:
    from harness.io import open_input
    from harness.report.render import job_text, render_markdown
    from harness.report.schema import load_report
    from harness.report.sync_phases import sync_verdicts

    paths = list(sys.argv[1:] if argv is None else argv)
    summary = None
    if paths[:1] == ["--summary"]:
        if len(paths) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        summary, paths = paths[1], paths[2:]
    if not paths:
        print(USAGE, file=sys.stderr)
        return 2
    failed = False
    for path in paths:
        try:
            if path.endswith(".md"):  # a page's Markdown (trend.md): only for the summary
                if summary:
                    with open_input(path, "r", encoding="utf-8", errors="replace") as f:
                        append_summary(summary, f.read())
                continue
            report = load_report(path)
            costs = ledger_lines(report)
            if summary:
                append_summary(summary, "\n".join([render_markdown(report), *(f"- {c}" for c in costs)]))
        except (BadInput, FileNotFoundError) as exc:
            print(f"python -m harness.report.nightly: error: {exc}", file=sys.stderr)
            return 2
        job = job_text(report)
        if job:  # a night on your recipe names it and its golden above its verdicts (issue 45)
            print(" ".join(f"JOB {report.scale or '-'} {job}".split()))
        found = failures(report)
        for f in found:
            print(f.line())
        for line in costs:
            print(" ".join(line.split()))
        syncs = sync_verdicts(report)
        for verdict in syncs:
            print(verdict.line())
        slow = any(v.late for v in syncs)
        failed |= slow
        if not report.passed and not found:
            print(f"FAIL {report.scale or '-'} pytest exit status {report.exit_status} ({path})")
        failed |= not report.passed
        if report.passed and slow:
            print(f"FAIL {report.scale or '-'} a weight-sync phase over its budget ({path})")
        elif report.passed:
            c = report.counts
            print(f"PASS {report.scale or '-'}: {c['passed']} passed, {c['skipped']} skipped ({path})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
