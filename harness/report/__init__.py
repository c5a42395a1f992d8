"""Run reports: schema-versioned JSON (schema), pytest collector (collect), HTML/Markdown (render),
nightly trend with regression detection (trend), and the `report` / `throughput` commands (commands)."""
from harness.report.schema import SCHEMA_VERSION, RunReport, TestVerdict, load_report, write_report

__all__ = ["SCHEMA_VERSION", "RunReport", "TestVerdict", "load_report", "write_report"]
