"""Ingest verl training logs into a `Run`: FileLogger jsonl, console lines, TensorBoard events, wandb CSV.

One entry point, `load_run(*paths)`. A path is a file or a run directory; several paths (or several
files in a directory) are segments of ONE run. Why segments: verl 0.9.1's FileLogger opens its file
with "wb" (verl/utils/tracking.py), so a resumed job truncates the log; users keep the old file
beside the new one, or concatenate console logs whose steps restart. Segments are ordered by their
first step and a later segment replaces the steps it repeats (the resumed job re-ran them).

Every irregularity has a message with file:line. Under `strict=True` (the default) a truncated
last line, a corrupt line, a duplicate step or an unusable value raises `BadInput`; under
`strict=False` it is kept as a warning in `run.meta.warnings`. Non-finite values (NaN/inf; orjson,
which the FileLogger uses, writes them as `null`) are never bad input: they are a finding, kept in
the series (the curve checks flag them) and listed in the warnings.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from harness.errors import BadInput
from harness.io import read_versioned
from harness.metrics.keys import META_FILE
from harness.metrics.run import RUN_META_SCHEMA, RUN_META_VERSION, Run, RunMeta, Series


@dataclass(frozen=True)
class Record:
    """One logged step: its metrics and where it was read ("file:line")."""

    step: int
    values: dict[str, float]
    where: str


class _Issues:
    """Collects problems; under strict ingest the first fatal one raises BadInput."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.warnings: list[str] = []
        self.truncated: dict[Path, str] = {}  # file -> "file:line" of its partial last line; judged in _assemble

    def fatal(self, where: str, what: str, hint: str = "") -> None:
        if self.strict:
            raise BadInput(f"{where}: {what}{'; ' + hint if hint else ''} (or ingest with strict=False / --lenient)")
        self.warnings.append(f"{where}: {what}; skipped")

    def note(self, where: str, what: str) -> None:
        self.warnings.append(f"{where}: {what}")


def _number(raw, where: str, key: str, issues: _Issues) -> float | None:
    if raw is None:  # orjson (verl's FileLogger) serializes NaN and inf as null
        issues.note(where, f"{key} is null (orjson writes NaN/inf as null); kept as NaN")
        return math.nan
    if isinstance(raw, (int, float)):
        value = float(raw)
        if not math.isfinite(value):
            issues.note(where, f"{key} is {value}; kept")
        return value
    issues.fatal(where, f"{key} is {type(raw).__name__} {str(raw)[:40]!r}, not a number")
    return None


def _read_lines(path: Path) -> tuple[list[str], bool]:
    """The file's lines, and whether its last line was complete (a crash mid-write leaves it without "\\n")."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete = text.endswith("\n")
    if complete:
        lines.pop()
    return lines, complete


# ---------------------------------------------------------------- verl FileLogger jsonl
def read_filelogger(path: Path, issues: _Issues) -> list[Record]:
    """verl FileLogger lines: {"step": N, "data": {"critic/rewards/mean": ..., ...}}."""
    lines, complete = _read_lines(path)
    records = []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        if not line.strip():
            continue
        try:
            try:
                obj = orjson.loads(line)  # 3-5x faster than json; the FileLogger itself writes with orjson
            except orjson.JSONDecodeError:
                obj = json.loads(line)  # json.dumps-written logs may hold NaN/Infinity tokens orjson rejects
            step, data = obj["step"], obj["data"]
            if not isinstance(step, int) or not isinstance(data, dict):
                raise ValueError("step must be an int and data an object")
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines) and not complete:
                issues.truncated[path] = where
            else:
                issues.fatal(where, f"corrupt line, not a FileLogger record ({exc})")
            continue
        try:  # the common case in one C-level pass: a NaN/inf anywhere makes the sum non-finite
            fast = math.isfinite(sum(data.values()))  # (None or a string raises TypeError)
        except TypeError:
            fast = False
        if fast:
            values = data
        else:
            values = {}
            for key, raw in data.items():
                value = _number(raw, where, key, issues)
                if value is not None:
                    values[key] = value
        records.append(Record(step, values, where))
    return records


# ---------------------------------------------------------------- verl console
_CONSOLE = re.compile(r"(?:^|[\s)\]])step:(\d+)( - .*)?$")
# pprint of numpy 2 scalars: np.float64(0.5), np.int64(3); torch scalars: tensor(0.5)
_WRAPPED = re.compile(r"^(?:np\.\w+|numpy\.\w+|tensor)\((.*)\)$")


def read_console(path: Path, issues: _Issues) -> list[Record]:
    """verl console metrics (`step:N - key:val - ...`, verl.utils.logger.aggregate_logger); other lines ignored."""
    lines, complete = _read_lines(path)
    records = []
    for number, line in enumerate(lines, 1):
        match = _CONSOLE.search(line.rstrip("\r"))
        if not match:
            continue
        where = f"{path}:{number}"
        if number == len(lines) and not complete:  # no newline: killed while printing, or still running
            issues.truncated[path] = where
            continue
        values, bad = {}, None
        for pair in (match.group(2) or "")[3:].split(" - "):
            key, sep, raw = pair.partition(":")
            unwrapped = _WRAPPED.match(raw.strip())
            try:
                if not sep or not key:
                    raise ValueError
                values[key.strip()] = float((unwrapped.group(1) if unwrapped else raw).strip())
            except ValueError:
                bad = pair
                break
        if bad is not None:
            issues.fatal(where, f"corrupt metrics line at {bad[:60]!r}")
            continue
        for key, value in values.items():
            if not math.isfinite(value):
                issues.note(where, f"{key} is {value}; kept")
        records.append(Record(int(match.group(1)), values, where))
    return records


# ---------------------------------------------------------------- TensorBoard
def read_tensorboard(path: Path, issues: _Issues) -> list[Record]:
    """Scalars of a TensorBoard event file (verl's tensorboard backend: SummaryWriter.add_scalar per key)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    by_step: dict[int, Record] = {}
    order: list[Record] = []
    size = path.stat().st_size
    consumed = 0
    try:
        for number, raw in enumerate(RawEventFileLoader(str(path)).Load(), 1):
            consumed += len(raw) + 16  # TFRecord framing: length (8) + crc (4) + data + crc (4)
            event = event_pb2.Event.FromString(raw)
            if not event.HasField("summary"):
                continue
            where = f"{path}:event{number}"
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    number_value = float(value.simple_value)
                elif kind == "tensor" and value.tensor.dtype in (1, 2, 19):  # DT_FLOAT, DT_DOUBLE, DT_HALF
                    array = tensor_util.make_ndarray(value.tensor)
                    if array.size != 1:
                        continue  # histograms/images are not metric series
                    number_value = float(array.reshape(()))
                else:
                    continue
                if not math.isfinite(number_value):
                    issues.note(where, f"{value.tag} is {number_value}; kept")
                record = by_step.get(event.step)
                if record is None or value.tag in record.values:  # a repeated step starts a new record
                    record = Record(event.step, {}, where)
                    by_step[event.step] = record
                    order.append(record)
                record.values[value.tag] = number_value
    except Exception as exc:  # the loader raises on a corrupt record (DataLossError and friends)
        issues.fatal(f"{path}:byte{consumed}", f"corrupt TensorBoard record ({type(exc).__name__}: {exc})")
    if consumed < size:  # trailing bytes that do not form a complete record: the writer was killed
        issues.truncated[path] = f"{path}:byte{consumed}"
    return order


# ---------------------------------------------------------------- wandb CSV export
_STEP_COLUMNS = ("_step", "Step", "step", "global_step", "trainer/global_step")
_WANDB_META = ("_runtime", "_timestamp", "_wandb")


def read_wandb_csv(path: Path, issues: _Issues) -> list[Record]:
    """A wandb CSV export: `run.history().to_csv()` (_step, metrics) or the UI export ("Step",
    "<run> - metric", "<run> - metric__MIN/__MAX"). One run per file."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise BadInput(f"{path}: empty CSV; export the run's history from wandb")
    header = rows[0]
    step_col = next((header.index(c) for c in _STEP_COLUMNS if c in header), None)
    if step_col is None:
        raise BadInput(f"{path}:1: no step column (one of {', '.join(_STEP_COLUMNS)}); is this a wandb export?")
    columns = {}
    for i, name in enumerate(header):
        if i == step_col or name.startswith(_WANDB_META) or name.endswith(("__MIN", "__MAX")):
            continue  # the UI export's __MIN/__MAX are min/max of the same metric over a sampling bucket
        columns[i] = name
    prefixes = {name.partition(" - ")[0] for name in columns.values() if " - " in name}
    if len(prefixes) > 1:
        raise BadInput(f"{path}:1: the CSV holds {len(prefixes)} runs ({', '.join(sorted(prefixes)[:3])}...); "
                       "export one run per file")
    if prefixes:
        columns = {i: n.partition(" - ")[2] if " - " in n else n for i, n in columns.items()}
    records = []
    for number, row in enumerate(rows[1:], 2):
        where = f"{path}:{number}"
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            if number == len(rows):
                issues.truncated[path] = where
            else:
                issues.fatal(where, f"corrupt row: {len(row)} cells, header has {len(header)}")
            continue
        try:
            step = int(float(row[step_col]))
        except ValueError:
            issues.fatal(where, f"step {row[step_col]!r} is not a number")
            continue
        values = {}
        for i, name in columns.items():
            cell = row[i].strip()
            if not cell:
                continue  # wandb leaves a cell empty when the metric was not logged at that step
            try:
                values[name] = float(cell)
            except ValueError:
                issues.fatal(where, f"{name} is {cell[:40]!r}, not a number")
                continue
            if not math.isfinite(values[name]):
                issues.note(where, f"{name} is {values[name]}; kept")
        records.append(Record(step, values, where))
    return records


# ---------------------------------------------------------------- assembly
def _kind(path: Path) -> str:
    if "tfevents" in path.name:
        return "tensorboard"
    if path.suffix in (".jsonl", ".json"):
        return "filelogger"
    if path.suffix == ".csv":
        return "wandb"
    return "console"


READERS = {"filelogger": read_filelogger, "tensorboard": read_tensorboard, "wandb": read_wandb_csv,
           "console": read_console}
_PREFERENCE = ("filelogger", "tensorboard", "wandb", "console")  # one run logged by several backends


def _run_files(directory: Path, issues: _Issues) -> list[Path]:
    found: dict[str, list[Path]] = {}
    # Logs sit at the top of a run directory; only TensorBoard nests (tensorboard_log/<project>/<exp>/).
    # Deeper *.jsonl are not metrics (verl's trainer.rollout_data_dir dumps generations as <step>.jsonl),
    # nor are other *.json files (configs, reports).
    top = [p for p in directory.iterdir() if p.suffix in (".jsonl", ".csv", ".log", ".txt", ".out")]
    for path in sorted({*top, *directory.rglob("*tfevents*")}):
        if path.is_file() and not path.name.startswith("."):
            found.setdefault(_kind(path), []).append(path)
    for kind in _PREFERENCE:
        if kind in found:
            others = [p for k, ps in found.items() if k != kind for p in ps]
            if others:
                issues.note(str(directory), f"read the {kind} logs; the same run's other logs were not read: "
                            + ", ".join(p.name for p in others[:5]))
            return found[kind]
    raise BadInput(f"{directory}: no verl logs (*.jsonl FileLogger, events.out.tfevents.*, *.csv, *.log) in this "
                   "directory; pass the run directory or the log files")


def _segments(records: list[Record]) -> list[list[Record]]:
    """Split one file's records where the step goes back (a resumed job appended to the same log)."""
    segments: list[list[Record]] = []
    for record in records:
        if not segments or record.step < segments[-1][-1].step:
            segments.append([])
        segments[-1].append(record)
    return segments


def _assemble(sources: list[Path], files: list[list[Record]], issues: _Issues) -> dict[int, Record]:
    # Files come in any order: order them by first step. Within a file a later segment (a resumed job
    # appending to the same console log) stays after the earlier one and wins where steps repeat.
    order = sorted((records[0].step, i) for i, records in enumerate(files))
    for (a, i), (b, j) in itertools.pairwise(order):
        if a == b:
            raise BadInput(f"{files[j][0].where}: starts at step {b} like {files[i][0].where}; logs of two different "
                           "runs? pass the segments of one run only")
    for path, where in issues.truncated.items():
        # The job that was killed mid-line and then resumed left a truncated earlier segment: expected.
        if path != sources[order[-1][1]]:
            issues.note(where, "truncated last record of a segment the resumed job continued; partial record skipped")
        else:
            issues.fatal(where, "truncated last record (the job was killed while writing, or is still running)",
                         "wait for the job to finish or remove the partial line")
    merged: dict[int, Record] = {}
    for _, i in order:
        for seg in _segments(files[i]):
            replaced = [r.step for r in seg if r.step in merged]
            if replaced:
                issues.note(seg[0].where, f"resumed run: steps {replaced[0]}..{replaced[-1]} logged again; "
                            f"these values replace those from {merged[replaced[0]].where}")
            previous = None
            for record in seg:
                if previous is not None and record.step == previous.step:
                    issues.fatal(record.where, f"duplicate step {record.step} (also at {previous.where})")
                    continue  # lenient: the first record of the step is kept
                merged[record.step] = record
                previous = record
    return merged


def _meta(paths: list[Path], sources: list[Path], warnings: list[str]) -> RunMeta:
    fields: dict = {}
    for p in paths:
        meta_path = p / META_FILE if p.is_dir() else p.parent / META_FILE
        if meta_path.is_file():
            # hand-written meta.json files (no schema) are accepted: scale, hardware, devices, versions
            fields = dict(read_versioned(meta_path, schema=RUN_META_SCHEMA, version=RUN_META_VERSION,
                                         what="run meta.json", hint="rewrite or remove it", missing="vanished",
                                         unversioned_ok=True))
            fields.pop("schema", None)
            fields.pop("schema_version", None)
            break
    known = {k: fields.pop(k) for k in ("scale", "hardware", "devices", "versions") if k in fields}
    return RunMeta(**known, sources=tuple(map(str, sources)), extra=fields, warnings=tuple(warnings))


def load_run(*paths: str | Path, name: str | None = None, strict: bool = True) -> Run:
    """Ingest one run from log files and/or run directories (several = segments of one resumed run).

    Raises BadInput naming file:line for a missing path, a truncated/corrupt line or a duplicate step
    (unless strict=False, which keeps them as `run.meta.warnings`). Metadata comes from `meta.json`
    beside the logs when present.
    """
    if not paths:
        raise BadInput("no run given: pass log files or run directories")
    issues = _Issues(strict)
    resolved = [Path(p) for p in paths]
    sources: list[Path] = []
    for p in resolved:
        if p.is_dir():
            sources.extend(_run_files(p, issues))
        elif p.is_file():
            sources.append(p)
        else:
            raise BadInput(f"{p}: no such file or directory; pass verl log files or run directories")
    read = [(p, READERS[_kind(p)](p, issues)) for p in sources]
    read = [(p, records) for p, records in read if records]
    if not read:
        raise BadInput(f"{', '.join(map(str, sources))}: no metric records (no `step` lines); is this a verl log?")
    merged = _assemble([p for p, _ in read], [r for _, r in read], issues)
    steps = sorted(merged)
    records = [merged[s].values for s in steps]
    if records[0] and all(r.keys() == records[0].keys() for r in records):  # same keys every step: column-wise
        all_steps, keys = tuple(steps), list(records[0])
        rows = map(operator.itemgetter(*keys), records) if len(keys) > 1 else ((r[keys[0]],) for r in records)
        series = {key: Series(all_steps, column) for key, column in zip(keys, zip(*rows, strict=True), strict=True)}
    else:
        columns: dict[str, tuple[list[int], list[float]]] = {}
        for step, values in zip(steps, records, strict=True):
            for key, value in values.items():
                column = columns.setdefault(key, ([], []))
                column[0].append(step)
                column[1].append(value)
        series = {key: Series(tuple(s), tuple(v)) for key, (s, v) in columns.items()}
    default_name = resolved[0].name if resolved[0].is_dir() else resolved[0].stem
    meta = _meta(resolved, sources, issues.warnings)
    return Run(name or meta.extra.pop("name", None) or default_name, series, meta)
