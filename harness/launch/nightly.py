"""The nightly NPU run's verdict lines: for every failing test of a tier's report.json, the suite, the
metric and the step its failure names (the project's failure messages say what and where), so the
morning mail reads `FAIL reduced-a2 suites/precision/test_curves.py metric critic/rewards/mean step 12: ...`.

`python -m harness.launch.nightly REPORT_JSON...` prints them (exit 1 when any test failed); used by
ci/nightly.sh after each tier.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from harness.errors import BadInput

# verl metric keys are slash paths (critic/rewards/mean, perf/throughput, timing_s/step); harness
# records use dotted names (memory.phases). A failure message names one or more of them.
_VERL_PREFIXES = ("actor", "critic", "perf", "timing_s", "timing_per_token_ms", "response_length", "prompt_length",
                  "training", "val-core", "val-aux", "global_seqlen", "rollout_corr", "response", "mfu")
_METRIC = re.compile(r"\b((?:" + "|".join(map(re.escape, _VERL_PREFIXES)) + r")(?:/[A-Za-z0-9_@.\-]+)+"
                     r"|(?:memory|curves|throughput|mla|launch|checkpoint|replay)\.[a-z_.]+)")
_STEP = re.compile(r"\bsteps?[ =:]+(\d+(?:\s*(?:\.\.|-)\s*\d+)?)", re.IGNORECASE)


@dataclass(frozen=True)
class Failure:
    scale: str
    suite: str  # the test file
    test: str
    metric: str  # "-" when the message names none
    step: str  # "-" when the message names none
    reason: str

    def line(self) -> str:
        return f"FAIL {self.scale} {self.suite}::{self.test} metric {self.metric} step {self.step}: {self.reason}"


def failures(report) -> list[Failure]:
    """Failing tests of a harness RunReport, with the metric and step their message names."""
    out = []
    for t in report.tests:
        if not t.failing:
            continue
        suite, _, test = t.nodeid.partition("::")
        reason = t.reason or t.outcome
        metric = _METRIC.search(reason)
        step = _STEP.search(reason)
        out.append(Failure(report.scale or "-", suite, test or "-", metric.group(1) if metric else "-",
                           re.sub(r"\s+", "", step.group(1)) if step else "-", reason))
    return out


def main(argv: list[str] | None = None) -> int:
    from harness.report.schema import load_report

    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m harness.launch.nightly REPORT_JSON...", file=sys.stderr)
        return 2
    failed = False
    for path in paths:
        try:
            report = load_report(path)
        except BadInput as exc:
            print(f"python -m harness.launch.nightly: error: {exc}", file=sys.stderr)
            return 2
        found = failures(report)
        for f in found:
            print(f.line())
        if not report.passed and not found:
            print(f"FAIL {report.scale or '-'} pytest exit status {report.exit_status} ({path})")
        failed |= not report.passed
        if report.passed:
            c = report.counts
            print(f"PASS {report.scale or '-'}: {c['passed']} passed, {c['skipped']} skipped ({path})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
