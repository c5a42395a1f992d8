"""Publishing a run's report: report.json / report.html / report.md written atomically, the nightly trend store
(a directory of report JSONs) and the trend pages over it. The statistics are harness.report.trend's and the
pages harness.report.render's; this module only reads and writes."""
from __future__ import annotations

from pathlib import Path

from harness.io import write_atomic
from harness.report.render import render_html, render_markdown, render_trend_html, render_trend_markdown
from harness.report.schema import RunReport, write_report
from harness.report.trend import DEFAULT_TOLERANCE, Step, find_steps, metrics


def publish(report: RunReport, report_dir: str | Path) -> Path:
    """Write report.json, report.html and report.md into `report_dir` (each atomically); return the JSON path."""
    report_dir = Path(report_dir)
    path = write_report(report, report_dir / "report.json")
    write_atomic(report_dir / "report.html", render_html(report))
    write_atomic(report_dir / "report.md", render_markdown(report))
    return path


def expand(paths) -> list[Path]:
    """Report files from files and trend-store directories (every *.json inside)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return out


def store(report: RunReport, history_dir: str | Path) -> Path:
    """Add a report to the trend store (a directory of report JSONs, one per nightly), atomically."""
    return write_report(report, Path(history_dir) / f"{report.name}.json")


def write_trend(reports: list[RunReport], out_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE) -> list[Step]:
    """trend.html + trend.md over `reports` (any order; sorted by creation) into out_dir; returns the steps."""
    ordered = sorted(reports, key=lambda r: r.created)
    steps = find_steps(ordered, tolerance)
    write_atomic(Path(out_dir) / "trend.html", render_trend_html(ordered, metrics(ordered), steps))
    write_atomic(Path(out_dir) / "trend.md", render_trend_markdown(ordered, steps))
    return steps
