"""Export the curves of reports -- each reward-alignment test's candidate run and the golden's reference runs -- to
TensorBoard event files or to wandb's CSV export layout, for people who compare curves there.

The curves come from the report (`curves.series`, harness.metrics.curves.band_series), not from the run
directories and golden it names: the report is what CI keeps and what its page drew, while a run directory may be
gone or on another machine. The golden's runs are there as the report keeps them (at most 16, each thinned to 1000
points; see harness.metrics.curves.MAX_REFERENCE_RUNS); a value the run logged as NaN/inf is exported as NaN.

One run per directory (TensorBoard) or file (CSV), named so `ingest` / `compare` (harness.metrics.ingest.load_run)
read each back as that run:
  DIR/tensorboard/<report>/<test>/{candidate,reference}/<run>/events.out.tfevents.ascend-rl-harness
  DIR/wandb-csv/<report>/<test>/{candidate,reference}/<run>.csv     columns: Step, "<run> - <metric>", ...
"""
from __future__ import annotations

import csv
import io
import itertools
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.io import write_atomic
from harness.report.publish import page_stems
from harness.report.schema import RunReport

FORMATS = {"tb": "tensorboard", "csv": "wandb-csv"}  # --export value -> directory under -o
EVENTS_NAME = "events.out.tfevents.ascend-rl-harness"  # fixed: exporting again replaces the file, never adds one


@dataclass(frozen=True)
class Curves:
    """One run's curves as a report holds them: {metric: (steps, values)} (NaN where the report has null)."""

    report: str
    test: str
    role: str  # "candidate" or "reference"
    run: str
    metrics: dict[str, tuple[tuple[int, ...], tuple[float, ...]]]
    where: tuple[str, str, str, str]  # report, test, role, run: one safe path component each

    @property
    def points(self) -> int:
        return sum(len(steps) for steps, _ in self.metrics.values())


def _curve(steps, values, where: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if not isinstance(steps, list) or not isinstance(values, list) or len(steps) != len(values):
        raise BadInput(f"{where}: steps and values must be two lists of one length; regenerate the report")
    if any(type(s) is not int or s < 0 for s in steps) or any(b <= a for a, b in itertools.pairwise(steps)):
        raise BadInput(f"{where}: steps must be whole numbers >= 0, increasing; regenerate the report")
    if any(v is not None and type(v) not in (int, float) for v in values):
        raise BadInput(f"{where}: a value is neither a number nor null; regenerate the report")
    return tuple(steps), tuple(math.nan if v is None else float(v) for v in values)


def _test_runs(series, where: str) -> list[tuple[str, str, dict]]:
    """(role, run name, {metric: curve}) of one test's `curves.series`, the candidate first."""
    if not isinstance(series, dict):
        raise BadInput(f"{where}: curves.series is not an object of metrics; regenerate the report")
    runs: dict[tuple[str, str], dict] = {}
    for metric, data in series.items():
        at = f"{where} metric {metric!r}"
        if not isinstance(data, dict):
            raise BadInput(f"{at}: not an object; regenerate the report")
        name = data.get("candidate_name") or "candidate"
        runs.setdefault(("candidate", str(name)), {})[metric] = _curve(data.get("candidate_steps"),
                                                                     data.get("candidate"), f"{at} candidate")
        refs = data.get("reference_runs") or []
        if not isinstance(refs, list):
            raise BadInput(f"{at}: reference_runs is not a list; regenerate the report")
        for i, ref in enumerate(refs):
            if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
                raise BadInput(f"{at} reference_runs[{i}]: not {{name, steps, values}}; regenerate the report")
            runs.setdefault(("reference", ref["name"]), {})[metric] = _curve(
                ref.get("steps"), ref.get("values"), f"{at} reference run {ref['name']!r}")
    return [(role, name, metrics) for (role, name), metrics in runs.items()]


def collect(reports: list[RunReport]) -> list[Curves]:
    """Every run's curves of every test that recorded `curves.series`, in report and test order; BadInput for a
    series of the wrong shape (naming the report, test and metric)."""
    out = []
    for report, report_stem in zip(reports, page_stems([r.name for r in reports]), strict=True):
        tests = [(nodeid, series) for nodeid, series in report.properties("curves.series")]
        test_stems = page_stems([nodeid.rsplit("::", 1)[-1] for nodeid, _ in tests])
        for (nodeid, series), test_stem in zip(tests, test_stems, strict=True):
            runs = _test_runs(series, f"report {report.name} test {nodeid}")
            for role in ("candidate", "reference"):
                mine = [(name, metrics) for r, name, metrics in runs if r == role]
                for (name, metrics), stem in zip(mine, page_stems([n for n, _ in mine]), strict=True):
                    out.append(Curves(report.name, nodeid, role, name, metrics, (report_stem, test_stem, role, stem)))
    return out


def _steps(curves: Curves) -> list[int]:
    return sorted({s for steps, _ in curves.metrics.values() for s in steps})


def csv_text(curves: Curves) -> str:
    """wandb's "Export CSV" layout, as harness.metrics.ingest.read_wandb_csv reads it: a `Step` column and one
    "<run> - <metric>" column per metric, empty where the run did not log the metric at that step. Values are
    Python's shortest round-trip repr (exact), NaN as wandb writes it."""
    run = curves.where[-1]  # the safe name: it holds no " - ", which separates run from metric in the header
    maps = {m: dict(zip(steps, values, strict=True)) for m, (steps, values) in curves.metrics.items()}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["Step", *(f"{run} - {m}" for m in maps)])
    for step in _steps(curves):
        writer.writerow([step, *("" if step not in m else "NaN" if math.isnan(m[step]) else repr(m[step])
                                 for m in maps.values())])
    return buf.getvalue()


def events_bytes(curves: Curves) -> bytes:
    """A TensorBoard event file of the run, written by the SummaryWriter verl's tensorboard backend uses
    (torch.utils.tensorboard, verl/utils/tracking.py), one event per step holding every metric logged then, as
    scalar summaries (`simple_value`), as verl writes them: that is what TensorBoard's scalar dashboard and
    EventAccumulator.Scalars() read. The v2 tensor summaries (`new_style`, double precision) written before left
    Scalars() empty (issue 33); a scalar summary is float32, so 0.1 reads back as 0.100000001 here (the wandb CSV
    export stays exact)."""
    from torch.utils.tensorboard import SummaryWriter

    maps = {m: dict(zip(steps, values, strict=True)) for m, (steps, values) in curves.metrics.items()}
    with tempfile.TemporaryDirectory(prefix="harness-tb-") as tmp:
        writer = SummaryWriter(tmp)
        try:
            for step in _steps(curves):
                for metric, by_step in maps.items():
                    if step in by_step:
                        writer.add_scalar(metric, by_step[step], step)
        finally:
            writer.close()
        (events,) = Path(tmp).glob("*tfevents*")
        return events.read_bytes()


def export(curves: list[Curves], out: str | Path, kind: str) -> list[dict]:
    """Write every run of `curves` under `out`/FORMATS[kind] (see the module docstring); returns one entry per run:
    report, test, role, run, path, metrics, points. The export is written into a new directory beside it and then
    swapped in whole: an export into the same -o kept the previous export's runs beside the new ones (and ingest read
    them back as this export's), and a directory symlink planted under -o was followed out of it. A failure leaves
    the previous export as it was."""
    import shutil

    from harness.io import current_umask, write_error

    out = Path(out)
    root = out / FORMATS[kind]
    if root.exists() and not root.is_symlink() and not root.is_dir():  # someone's file: never replaced
        raise BadInput(f"{root}: cannot write the export there (a file, not a directory); move it or pass another -o")
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=out, prefix=f".{root.name}.", suffix=".tmp"))  # new, empty, ours alone
        os.chmod(stage, 0o777 & ~current_umask())
    except OSError as exc:  # a full or read-only -o: one line naming it
        raise write_error(root, exc) from None
    written = []
    try:
        for c in curves:
            base, shown = stage.joinpath(*c.where), root.joinpath(*c.where)
            if kind == "tb":
                write_atomic(base / EVENTS_NAME, events_bytes(c))
            else:
                write_atomic(base.with_name(base.name + ".csv"), csv_text(c))
            written.append({"report": c.report, "test": c.test, "role": c.role, "run": c.run,
                            "path": str(shown if kind == "tb" else shown.with_name(shown.name + ".csv")),
                            "metrics": len(c.metrics), "points": c.points})
        old = None
        if root.exists() or root.is_symlink():
            old = out / f".{root.name}.old-{os.getpid()}"
            os.rename(root, old)  # the link itself, never its target
        try:
            os.rename(stage, root)
        except OSError:
            if old is not None:
                os.rename(old, root)
            raise
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if old is not None:
        if old.is_symlink() or not old.is_dir():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    return written
