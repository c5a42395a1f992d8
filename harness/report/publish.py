"""Publishing a run's report: report.json / report.html / report.md written atomically, the nightly trend store
(a directory of report JSONs) and the trend pages over it. The statistics are harness.report.trend's and the
pages harness.report.render's; this module only reads and writes."""
from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path

from harness.errors import BadInput
from harness.io import write_atomic
from harness.report.render import render_html, render_markdown, render_trend_html, render_trend_markdown
from harness.report.schema import RunReport, load_report, write_report
from harness.report.trend import DEFAULT_TOLERANCE, Step, find_steps, metrics

LOG_NAME = "pytest.log"
TREND_FILES = ("trend.html", "trend.md")
LINKED_OPTIONS = ("--run-dir", "--baseline")  # directories a report page links to (issue 15)
QUARANTINE_SUFFIX = ".corrupt"


def safe_name(name: str) -> str:
    """`name` as one harmless path component (issue 16: a report named `../../x` was written outside -o)."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._") or "report"
    return cleaned[:120]


def report_links(report_dir: Path, report: RunReport) -> dict[str, str]:
    """What the report page links to: the run's pytest log when `run` wrote one (relative: it sits beside the
    page) and the run directories the command line named (absolute: resolved where the run ran)."""
    links = {LOG_NAME: LOG_NAME} if (report_dir / LOG_NAME).exists() or \
        (report_dir / f".{LOG_NAME}.new").exists() else {}
    args = list(report.command)
    for option in LINKED_OPTIONS:
        for i, arg in enumerate(args):
            value = args[i + 1] if arg == option and i + 1 < len(args) else arg.partition("=")[2] \
                if arg.startswith(option + "=") else None
            if value:
                links[f"{option} {value}"] = Path(value).resolve().as_uri()
    return links


def publish(report: RunReport, report_dir: str | Path, previous: RunReport | None = None,
            trend: bool = False) -> Path:
    """Write report.html, report.md and then report.json into `report_dir` (each atomically); return the JSON
    path. A trend page left from an earlier run is removed first: it described another report, and a run killed
    before it writes its own trend must not leave the two disagreeing (issue 16). `trend`: the page links the
    trend.html its caller writes next."""
    report_dir = Path(report_dir)
    for name in TREND_FILES:
        (report_dir / name).unlink(missing_ok=True)
    links = {**report_links(report_dir, report), **({"trend": TREND_FILES[0]} if trend else {})}
    write_atomic(report_dir / "report.html", render_html(report, previous, links))
    write_atomic(report_dir / "report.md", render_markdown(report))
    return write_report(report, report_dir / "report.json")  # last: its presence means the pages match it


EVIDENCE_DIR = "evidence"
# What a run directory's verdicts are computed from, and what says why it ended: verl's FileLogger, the
# harness's metadata, the launcher's verdict and the job's and launcher's logs.
EVIDENCE_FILES = ("metrics.jsonl", "meta.json", "launch.json", "job.log", "launch.log")


def keep_evidence(report_dir: str | Path, run_dir: str | Path, name: str, extra: tuple[Path, ...] = ()) -> str:
    """Copy a run's evidence (EVIDENCE_FILES present in `run_dir`, plus `extra` files) into
    REPORT_DIR/evidence/NAME/, where it outlives the pytest temp directory the run lived in; returns that path
    relative to the report directory (what the page links). Written into a fresh directory that replaces the old
    one by rename: a reader never sees half of one run's files beside another's. Idempotent per session."""
    import shutil
    import tempfile

    evidence = Path(report_dir) / EVIDENCE_DIR
    evidence.mkdir(parents=True, exist_ok=True)
    target = evidence / safe_name(name)
    staging = Path(tempfile.mkdtemp(dir=evidence, prefix=f".{target.name}."))
    try:
        for source in (*(Path(run_dir) / f for f in EVIDENCE_FILES), *extra):
            if source.is_file():
                shutil.copyfile(source, staging / source.name)
        staging.chmod(0o755)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise BadInput(f"{target}: cannot keep the run's evidence there ({exc.strerror or exc})") from None
    return f"{EVIDENCE_DIR}/{target.name}/"


def expand(paths) -> list[Path]:
    """Report files from files and trend-store directories (every *.json inside)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return out


def store(report: RunReport, history_dir: str | Path) -> Path:
    """Add a report to the trend store (a directory of report JSONs, one per nightly), atomically. The key has
    a random suffix: names carry the time to the second, and two reports in one second overwrote each other
    (issue 16)."""
    return write_report(report, Path(history_dir) / f"{safe_name(report.name)}-{secrets.token_hex(4)}.json")


def load_store(history_dir: str | Path, warn=None) -> list[RunReport]:
    """Every report in a trend-store directory, oldest first. An entry that does not load is renamed aside
    (`.corrupt`) with a warning naming it, and the trend goes on without it (issue 16: one corrupt entry made
    every later nightly exit 2 with no trend)."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    reports = []
    for path in expand([history_dir]) if Path(history_dir).is_dir() else []:  # none yet: the first night
        try:
            reports.append(load_report(path))
        except BadInput as exc:
            aside = path.with_name(path.name + QUARANTINE_SUFFIX)
            path.rename(aside)
            warn(f"warning: trend store entry quarantined as {aside}: {exc}")
    return sorted(reports, key=lambda r: r.created)


def write_trend(reports: list[RunReport], out_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE,
                pages: dict[str, str] | None = None) -> list[Step]:
    """trend.html + trend.md over `reports` (any order; sorted by creation) into out_dir; returns the steps.
    `pages`: report name -> address of its page, relative to out_dir (the plots' points link there)."""
    ordered = sorted(reports, key=lambda r: r.created)
    steps = find_steps(ordered, tolerance)
    write_atomic(Path(out_dir) / "trend.html",
                 render_trend_html(ordered, metrics(ordered), steps, pages, tolerance))
    write_atomic(Path(out_dir) / "trend.md", render_trend_markdown(ordered, steps))
    return steps
