"""Run reports: schema-versioned JSON (`schema`), the pytest collector (`collect`), HTML/Markdown pages
(`render`, never computes; `page`: the jinja2 frame with autoescape, CSP and the table script), trend
statistics with regression detection (`trend`, pure), writing reports and the trend store (`publish`), the
page check in headless Chromium (`browser`) and the nightly verdict lines (`nightly`)."""
from harness.report.schema import SCHEMA_VERSION, RunReport, TestVerdict, load_report, write_report

__all__ = ["SCHEMA_VERSION", "RunReport", "TestVerdict", "load_report", "write_report"]
