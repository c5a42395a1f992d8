"""Publishing a run's report: the report set (report.json / .html / .md, junit.xml, pytest.log, the trend pages)
swapped in as one, the nightly trend store (a directory of report JSONs) and the trend pages over it. The statistics are
harness.report.trend's and the pages harness.report.render's; this module only reads and writes.

The set is one generation: a new run writes every file into a fresh private directory `.gen-*` beside the
current one, and one rename of the `.current` link swaps the whole set in; each public name (report.html, ...)
is a link through `.current`. A run killed at any moment leaves the previous set or the new one, never a new page
beside the old JSON (the per-file renames did), and no file is ever written through a name someone could have
planted a link at. This is kubelet's atomic writer for ConfigMap volumes (kubernetes pkg/volume/util/
atomic_writer.go: `..data -> ..<timestamp>`, each key a link through `..data`).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from harness.errors import BadInput, NewerVersion
from harness.io import WRITE_ERRNOS, current_umask, file_kind, write_atomic, write_error
from harness.report.junit import render_junit
from harness.report.render import render_html, render_markdown, render_trend_html, render_trend_markdown
from harness.report.schema import RunReport, load_report, write_report
from harness.report.trend import DEFAULT_TOLERANCE, Step, find_steps, metrics

LOG_NAME = "pytest.log"
JUNIT_NAME = "junit.xml"  # harness.report.junit: what CI test views read, properties as JSON
TREND_FILES = ("trend.html", "trend.md")
LINKED_OPTIONS = ("--run-dir", "--baseline")  # directories a report page links to
QUARANTINE_SUFFIX = ".corrupt"
EVIDENCE_DIR = "evidence"  # copies of the run directories the verdicts were computed from (keep_evidence)
REPORT_SET = ("report.json", "report.html", "report.md", JUNIT_NAME, LOG_NAME, *TREND_FILES, EVIDENCE_DIR)
CURRENT = ".current"  # the link to the generation directory whose files the public names show
GENERATION_PREFIX = ".gen-"


def safe_name(name: str) -> str:
    """`name` as one harmless path component of at most 120 characters (a report named `../../x` was
    once written outside -o)."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._") or "report"
    return cleaned[:120]


def page_stems(names: list[str]) -> list[str]:
    """One distinct file stem per report, in order, each a safe name of at most 130 characters: nights that share
    a name (or the first 120 characters of one) each keep a page. Pages keyed by name collapsed them (3 of 70
    nights kept), and a "-1" appended per collision grew past the file system's 255 (ENAMETOOLONG)."""
    used: set[str] = set()
    out = []
    for name in names:
        base = stem = safe_name(name)
        k = 1
        while stem in used:
            k += 1
            stem = f"{base}-{k}"
        used.add(stem)
        out.append(stem)
    return out


class Generation:
    """A report set being written: a fresh private directory (mkdtemp, 0700: nothing planted there can be
    followed) in the report directory. `commit()` makes it the current set with one rename; `discard()` drops it.
    The report directory must be held (harness.io.exclusive) by the writer."""

    def __init__(self, report_dir: str | Path):
        self.report_dir = Path(report_dir)
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=GENERATION_PREFIX, dir=self.report_dir)).resolve()
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS:
                raise write_error(self.report_dir, exc) from None
            raise

    def commit(self) -> None:
        """Swap this set in as one: the public names become links through `.current` (once; an older report
        directory's plain files are kept as its current generation first), then `.current` is renamed onto a link
        to this generation. Older generations are removed."""
        try:
            os.chmod(self.path, 0o777 & ~current_umask())  # readable like any report once it is whole
            _link_public_names(self.report_dir, [n for n in REPORT_SET if (self.path / n).exists()])
            _replace_link(self.report_dir / CURRENT, self.path.name)
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS:
                raise write_error(self.report_dir, exc) from None
            raise
        for name in REPORT_SET:  # a name this set lacks (no trend tonight) is absent, not a dangling link
            link = self.report_dir / name
            if link.is_symlink() and not link.exists():
                link.unlink(missing_ok=True)
        for old in self.report_dir.glob(f"{GENERATION_PREFIX}*"):
            if old.name != self.path.name and old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _replace_link(path: Path, target: str) -> None:
    """`path` becomes a symbolic link to `target` in one rename (whatever was there, a link or a file, is replaced;
    nothing is written through it)."""
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _link_public_names(report_dir: Path, names: list[str]) -> None:
    """Each of `names` a link to `.current/<name>`, and every plain file of REPORT_SET too: a report directory of an
    older harness holds plain files, hard-linked into a generation made current first, so the set shown stays the
    old one until the swap."""
    current = report_dir / CURRENT
    plain = [n for n in REPORT_SET if (report_dir / n).is_file() and not (report_dir / n).is_symlink()]
    if plain and not current.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=GENERATION_PREFIX, dir=report_dir))
        for name in plain:
            os.link(report_dir / name, old / name)
        os.chmod(old, 0o777 & ~current_umask())
        _replace_link(current, old.name)
    for name in dict.fromkeys([*plain, *names]):
        path, target = report_dir / name, f"{CURRENT}/{name}"
        if not (path.is_symlink() and os.readlink(path) == target):
            if path.is_dir() and not path.is_symlink():
                raise BadInput(f"{path}: a directory where the report's {name} goes; move it away")
            _replace_link(path, target)


def current_generation(report_dir: str | Path) -> str | None:
    """The name of the generation directory the report directory shows, None before the first set."""
    try:
        return os.readlink(Path(report_dir) / CURRENT)
    except OSError:
        return None


_STAGED: dict[Path, Generation] = {}  # report directories whose next set a caller (the `run` command) commits


@contextlib.contextmanager
def staged(report_dir: str | Path):
    """A Generation the report collector of an in-process pytest session writes into instead of committing its
    own (`run` adds pytest.log and the trend, then commits); discarded unless the caller committed it."""
    generation = Generation(report_dir)
    key = Path(report_dir).resolve()
    _STAGED[key] = generation
    try:
        yield generation
    finally:
        del _STAGED[key]
        if generation.path.exists() and current_generation(report_dir) != generation.path.name:
            generation.discard()


def staged_for(report_dir: str | Path) -> Generation | None:
    return _STAGED.get(Path(report_dir).resolve())


def distinct_names(reports: list[RunReport]) -> list[RunReport]:
    """`reports` with a name shared by several of them told apart (`name #2`, `name #3`, in order): pages and trend
    links are keyed by name, and nights sharing one collapsed into one page."""
    import dataclasses

    seen: dict[str, int] = {}
    out = []
    for r in reports:
        seen[r.name] = seen.get(r.name, 0) + 1
        out.append(r if seen[r.name] == 1 else dataclasses.replace(r, name=f"{r.name} #{seen[r.name]}"))
    return out


def report_links(set_dir: Path, report: RunReport) -> dict[str, str]:
    """What the report page links to: the run's pytest log when `run` writes one into the set and the evidence the
    set keeps (relative: they sit beside the page), and the run directories the command line named (absolute:
    resolved where the run ran)."""
    links = {LOG_NAME: LOG_NAME} if (set_dir / LOG_NAME).exists() else {}
    evidence = set_dir / EVIDENCE_DIR
    for kept in sorted(evidence.iterdir()) if evidence.is_dir() else ():
        links[f"evidence {kept.name}"] = f"{EVIDENCE_DIR}/{kept.name}/"
    args = list(report.command)
    for option in LINKED_OPTIONS:
        for i, arg in enumerate(args):
            value = args[i + 1] if arg == option and i + 1 < len(args) else arg.partition("=")[2] \
                if arg.startswith(option + "=") else None
            if value:
                links[f"{option} {value}"] = Path(value).resolve().as_uri()
    return links


def publish(report: RunReport, set_dir: str | Path, previous: RunReport | None = None,
            trend: bool = False, history=()) -> Path:
    """Write report.html, report.md, junit.xml and report.json into `set_dir`, a Generation's directory (it starts
    empty: no trend page of another report can sit beside them); return the JSON path. `trend`: the page links the
    trend.html its caller writes next; `history`: the earlier nights, oldest first (the tiles' sparklines)."""
    set_dir = Path(set_dir)
    keep_evidence(set_dir, report.tests)
    links = {**report_links(set_dir, report), JUNIT_NAME: JUNIT_NAME, **({"trend": TREND_FILES[0]} if trend else {})}
    write_atomic(set_dir / "report.html", render_html(report, previous, links, history=history))
    write_atomic(set_dir / "report.md", render_markdown(report))
    write_atomic(set_dir / JUNIT_NAME, render_junit(report))
    return write_report(report, set_dir / "report.json")


# What a run directory's verdicts are computed from, and what says why it ended: verl's FileLogger, the
# harness's metadata, the launcher's verdict and the job's and launcher's logs. A test names a run directory it
# asserted on with the EVIDENCE_PROPERTY {"name", "run_dir", "extra"}; the set keeps copies of them under
# evidence/NAME/ (the pytest temp directory the run lived in is deleted a few sessions later).
EVIDENCE_FILES = ("metrics.jsonl", "meta.json", "launch.json", "job.log", "launch.log")
EVIDENCE_PROPERTY = "evidence"


def keep_evidence(set_dir: str | Path, tests) -> None:
    """Copy the evidence every test in `tests` (TestVerdicts) names into the set's evidence/ directory, once per
    run directory, and point the test's `run_dir` property at the copy (relative: it sits beside the page)."""
    kept: dict[str, str] = {}
    for test in tests:
        # consumed here, usable or not: it names host paths (harness.report.collect leaves it unredacted for this)
        doc = test.properties.pop(EVIDENCE_PROPERTY, None)
        if not isinstance(doc, dict) or not isinstance(doc.get("run_dir"), str):
            continue
        name = safe_name(str(doc.get("name") or Path(doc["run_dir"]).name))
        if name not in kept:
            target = Path(set_dir) / EVIDENCE_DIR / name
            target.mkdir(parents=True, exist_ok=True)
            for source in (*(Path(doc["run_dir"]) / f for f in EVIDENCE_FILES), *map(Path, doc.get("extra") or ())):
                try:
                    if source.is_file() and not source.is_symlink():
                        shutil.copyfile(source, target / source.name)
                except OSError as exc:
                    if exc.errno in WRITE_ERRNOS:
                        raise write_error(target, exc) from None
                    raise
            kept[name] = f"{EVIDENCE_DIR}/{name}/"
        test.properties["run_dir"] = kept[name]


def expand(paths) -> list[Path]:
    """Report files from files and trend-store directories (every *.json inside)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return out


def store(report: RunReport, history_dir: str | Path) -> Path:
    """Add a report to the trend store (a directory of report JSONs, one per nightly), atomically and never over
    another entry (linked into place). The key has a random suffix: names carry the time to the second, and two
    reports in one second overwrote each other."""
    path = Path(history_dir) / f"{safe_name(report.name)}-{secrets.token_hex(4)}.json"
    return write_report(report, path, overwrite=False)


def check_store(history_dir: str | Path, option: str = "--history") -> Path:
    """A trend store given on the command line: a directory, or nothing yet (the first night creates it); checked
    before the tests run (`run --history FILE` ran every test, then crashed writing into the file)."""
    path = Path(history_dir)
    kind = file_kind(path)
    if kind not in (None, "directory"):
        raise BadInput(f"{option} {path}: a {kind}, not a trend-store directory; pass a directory (created if absent)")
    return path


def load_store(history_dir: str | Path, warn=None) -> list[RunReport]:
    """Every report in a trend-store directory, oldest first. An entry that does not load is renamed aside
    (`.corrupt`) with a warning naming it, and the trend goes on without it (one corrupt entry once made
    every later nightly exit 2 with no trend). Never renamed: an entry of a newer schema (the newer harness reads
    it), one that is no regular file (a FIFO, a link to /dev/zero: not opened at all), and any entry of a store this
    process cannot write (a read-only store renders; the entry is skipped with the reason)."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    reports = []
    for path in expand([history_dir]) if Path(history_dir).is_dir() else []:  # none yet: the first night
        try:
            reports.append(load_report(path))
        except NewerVersion as exc:
            warn(f"warning: trend store entry {path} skipped, written by a newer version: {exc}")
        except BadInput as exc:
            if file_kind(path) != "regular file":
                warn(f"warning: trend store entry {path} skipped: {exc}")
                continue
            aside = path.with_name(path.name + QUARANTINE_SUFFIX)
            try:
                path.rename(aside)
            except OSError as error:  # a read-only (or someone else's) store: leave it, say so
                warn(f"warning: trend store entry {path} skipped, left in place ({error.strerror}: a read-only "
                     f"store is never changed): {exc}")
                continue
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
