"""Ingest verl training logs into a `Run`: FileLogger jsonl, console lines, TensorBoard events, wandb CSV; and
verl's Ascend nightly baseline summaries (`key: value` per metric) into a `Summary`.

One entry point, `load_run(*paths)`. A path is a file or a run directory; several paths (or several
files in a directory) are segments of ONE run. Why segments: verl 0.9.1's FileLogger opens its file
with "wb" (verl/utils/tracking.py `FileLogger.__init__`), so a resumed job truncates the log; users keep the
old file beside the new one, or concatenate console logs whose steps restart. Segments are ordered by their
first step and a later segment replaces the steps it repeats (the resumed job re-ran them).

Files are streamed line by line into column arrays (8 bytes a value): a 2M-line log never sits in memory as
text or as per-line dicts, and the peak stays within about twice the series it returns (reading the whole file
took 3.5 GiB for a 373 MiB log).

Every irregularity has a message with file:line. Under `strict=True` (the default) a truncated last line, a
corrupt line or value, a duplicate step raises `BadInput`; under `strict=False` (`--lenient`) the bad part is
skipped -- the bad pair only, the good pairs of its line are kept -- and `run.meta.warnings` says what and how
many lines/pairs were skipped. Non-finite values (NaN/inf; orjson, which the FileLogger uses, writes them as
`null`) are never bad input: they are a finding, kept in the series (the curve checks flag them) and listed in
the warnings. Irregular but readable shapes are read and warned about: steps out of order, lines wrapped
mid-key (joined), notes appended after a line's last value, CSVs that are not wandb exports.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from harness.config.hardware import PROFILES
from harness.errors import BadInput
from harness.io import BOM, file_kind, open_input, read_versioned
from harness.metrics.keys import HYDRA_CONFIG, META_FILE
from harness.metrics.run import RUN_META_SCHEMA, RUN_META_VERSION, Run, RunMeta, Series, Summary
from harness.numeric import MAX_COUNT, MAX_STEP, METRIC_LIMIT, is_metric_value

# Warnings kept per kind: a log with a NaN on every one of 2M lines must not hold 2M strings.
MAX_WARNINGS_PER_KIND = 20


class _Issues:
    """Collects problems; under strict ingest the first fatal one raises BadInput. Counts what lenient skipped."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.warnings: list[str] = []
        self.kinds: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()  # "lines" / "pairs" dropped under lenient ingest
        # file -> ("file:line", line or event number, unit) of its partial last line; judged in _assemble
        self.truncated: dict[Path, tuple[str, int, str]] = {}
        self.hardware: dict[str, str] = {}  # profile name -> "file:line" of a log line naming its device
        self.dropped: list[tuple[Path, int, str]] = []  # (file, line/event number, unit label) of each skipped line
        self.places: list[str] = []  # the dropped lines and the steps around them (resolve_dropped)

    def fatal(self, where: str, what: str, hint: str = "", *, unit: str = "lines",
              at: tuple[Path, int, str] | None = None) -> None:
        """Bad input: raise (strict), or skip one line (unit="lines") or one key:value pair (unit="pairs"); `at`,
        for a skipped line: (file, its line or event number, "" or "event"), to say which steps it lies between."""
        if self.strict:
            raise BadInput(f"{where}: {what}{'; ' + hint if hint else ''} (or ingest with strict=False / --lenient)")
        self.skipped[unit] += 1
        if at is not None:
            self.dropped.append(at)
        self.note(where, f"{what}; {'line' if unit == 'lines' else 'pair'} skipped", kind="skipped")

    def resolve_dropped(self, files: list[_Records]) -> None:
        """Name every line lenient ingest dropped by the steps around it (a TensorBoard record flipped mid-file
        once dropped 16 of 30 steps as "1 line skipped"): consecutive drops between the same two steps are one
        place, "metrics.jsonl:11-12 (between steps 10 and 13)"."""
        by_path = {f.path: f for f in files}
        groups: list[list] = []
        for path, position, unit in sorted(self.dropped, key=lambda d: (str(d[0]), d[1])):
            records = by_path.get(path)
            around = "no step read from this file"
            if records is not None and len(records):
                positions = np.frombuffer(records.positions, dtype=np.int64)
                steps = np.frombuffer(records.steps, dtype=np.int64)
                i = int(np.searchsorted(positions, position))
                before = int(steps[:i].max()) if i else None
                after = int(steps[i:].min()) if i < len(steps) else None
                around = (f"between steps {before} and {after}" if before is not None and after is not None
                          else f"after step {before}" if before is not None else f"before step {after}")
            if groups and groups[-1][0] == path and groups[-1][3] == around:
                groups[-1][2] = position
            else:
                groups.append([path, position, position, around, unit])
        self.places = [f"{path.name}:{unit}{first}{f'-{last}' if last != first else ''} ({around})"
                       for path, first, last, around, unit in groups]

    def note(self, where: str, what: str, *, kind: str = "note") -> None:
        self.kinds[kind] += 1
        if self.kinds[kind] <= MAX_WARNINGS_PER_KIND:
            self.warnings.append(f"{where}: {what}")

    def summary(self) -> list[str]:
        out = [*self.warnings]
        out += [f"... {n - MAX_WARNINGS_PER_KIND} more {kind} warnings like these"
                for kind, n in self.kinds.items() if n > MAX_WARNINGS_PER_KIND]
        if self.skipped:
            shown = self.places[:MAX_WARNINGS_PER_KIND]
            more = f", ... {len(self.places) - len(shown)} more" if len(self.places) > len(shown) else ""
            out.append(f"lenient ingest skipped {self.skipped['lines']} lines and {self.skipped['pairs']} key:value "
                       "pairs (the good pairs of a partly bad line are kept)"
                       + (f"; dropped: {', '.join(shown)}{more}" if shown else ""))
        return out


class _Column:
    """One metric of one file: the records that logged it and the values. A metric logged by every record from
    its first one on (the usual case) keeps no index array."""

    __slots__ = ("first", "index", "values")

    def __init__(self, first: int):
        self.first = first
        self.index: array | None = None
        self.values = array("d")

    def add(self, record: int, value: float) -> None:
        if self.index is None:
            if record == self.first + len(self.values):
                self.values.append(value)
                return
            self.index = array("q", range(self.first, self.first + len(self.values)))
        self.index.append(record)
        self.values.append(value)

    def records(self) -> np.ndarray:
        if self.index is None:
            return np.arange(self.first, self.first + len(self.values), dtype=np.int64)
        return np.frombuffer(self.index, dtype=np.int64)


class _Records:
    """One file's records, column-wise: step and position ("line" number, "event" number) of every record, and
    per metric a `_Column`."""

    def __init__(self, path: Path, unit: str = ""):
        self.path = path
        self.unit = unit  # "" -> file:12 (a line), "event" -> file:event12
        self.steps = array("q")
        self.positions = array("q")
        self.columns: dict[str, _Column] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def where(self, record: int) -> str:
        return f"{self.path}:{self.unit}{self.positions[record]}"

    def add(self, step: int, position: int, values: dict[str, float]) -> None:
        record = len(self.steps)
        self.steps.append(step)
        self.positions.append(position)
        columns = self.columns
        for key, value in values.items():
            column = columns.get(key)
            if column is None:
                column = columns[key] = _Column(record)
            if column.index is None and record == column.first + len(column.values):
                column.values.append(value)  # the dense case inline: one call less per value of 2M lines
            else:
                column.add(record, value)


def _number(raw, where: str, key: str, issues: _Issues) -> float | None:
    """A JSON value as a float; None (after a fatal issue) when it is not one. bool is not a number here
    (JSON `true` would otherwise read as 1.0)."""
    if raw is None:  # orjson (verl's FileLogger) serializes NaN and inf as null
        issues.note(where, f"{key} is null (orjson writes NaN/inf as null); kept as NaN", kind="non-finite")
        return math.nan
    if type(raw) in (int, float):
        try:
            value = float(raw)
        except OverflowError:
            issues.fatal(where, f"{key} is {str(raw)[:20]}..., too big for a float", unit="pairs")
            return None
        if not math.isfinite(value):
            issues.note(where, f"{key} is {value}; kept", kind="non-finite")
        elif not _in_range(value, where, key, issues):
            return None
        return value
    issues.fatal(where, f"{key} is {type(raw).__name__} {str(raw)[:40]!r}, not a number", unit="pairs")
    return None


def _in_range(value: float, where: str, key: str, issues: _Issues) -> bool:
    """A finite value within harness.numeric's metric range; beyond it (1e308) no metric lies, and its sums and
    squares would overflow the statistics: a bad pair."""
    if abs(value) <= METRIC_LIMIT:
        return True
    issues.fatal(where, f"{key} is {value:g}, beyond +-{METRIC_LIMIT:g} (no metric takes it)", unit="pairs")
    return False


def _valid_step(step) -> bool:
    return type(step) is int and 0 <= step < MAX_STEP


# The longest line read as a line: verl's FileLogger writes ~3 KB per step (a few hundred metrics stay under 64 KB),
# its console line is shorter still; 1 MiB leaves a wide margin and bounds what one line can cost.
MAX_LINE = 1 << 20


def _lines(path: Path, mode: str = "rb") -> Iterator[tuple[int, bytes | str, bool]]:
    """(line number, line without its newline, complete) streamed; the last line is incomplete when the file
    does not end with a newline (a crash mid-write, or a job still running). A UTF-8 byte-order mark is dropped
    (a console log saved by an editor started "\ufeffstep:1", and step 1 was silently lost)."""
    with open_input(path, mode, **({} if mode == "rb" else {"encoding": "utf-8-sig", "errors": "replace",
                                                             "newline": ""})) as f:
        newline = b"\n" if mode == "rb" else "\n"
        number = 0
        while line := f.readline(MAX_LINE + 1):
            number += 1
            if number == 1 and mode == "rb":
                line = line.removeprefix(BOM)
            if len(line) > MAX_LINE and not line.endswith(newline):
                # an over-long line is read no further than MAX_LINE: the rest is skipped in bounded pieces, and
                # the cut line fails to parse where it stands (path:line named). A 1 GB single-line JSONL once
                # peaked at ~5x its size in RSS (the line, its decode, the parse).
                while (rest := f.readline(MAX_LINE)) and not rest.endswith(newline):
                    pass
                yield number, line[:MAX_LINE], bool(rest)
                continue
            complete = line.endswith(newline)
            yield number, (line[:-1] if complete else line), complete


# ---------------------------------------------------------------- verl FileLogger jsonl
_FAST_TYPES = {float, int}


def _strict_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # a finite literal such as 1e400 that does not fit a float
        raise OverflowError(f"{text[:20]} is too big for a float")
    return value


def read_filelogger(path: Path, issues: _Issues) -> _Records:
    """verl FileLogger lines: {"step": N, "data": {"critic/rewards/mean": ..., ...}} (orjson, one per line)."""
    out = _Records(path)
    for number, line, complete in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            try:
                obj = orjson.loads(line)  # 3-5x faster than json; the FileLogger itself writes with orjson
            except orjson.JSONDecodeError:
                # json.dumps-written logs may hold NaN/Infinity tokens orjson rejects; integers beyond 64 bits too
                obj = json.loads(line, parse_float=_strict_float)
            step, data = obj["step"], obj["data"]
            if not _valid_step(step) or not isinstance(data, dict):
                raise ValueError(f"step must be an integer in [0, 2^62) and data an object, got step "
                                 f"{str(step)[:20]!r}")
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            if not complete:
                issues.truncated[path] = (where, number, "")
            else:
                issues.fatal(where, f"corrupt line, not a FileLogger record ({str(exc)[:80]})", at=(path, number, ""))
            continue
        values = data.values()
        try:  # the common case in one C-level pass: plain numbers, finite and in range (NaN, inf, 1e308 fail it)
            fast = set(map(type, values)) <= _FAST_TYPES and sum(map(abs, values)) <= METRIC_LIMIT
        except OverflowError:  # an int beyond float range
            fast = False
        if not fast:
            checked = {}
            for key, raw in data.items():
                value = _number(raw, where, key, issues)
                if value is not None:
                    checked[key] = value
            data = checked
        out.add(step, number, data)
    return out


# ---------------------------------------------------------------- verl console
# verl's console logger prints `concat_dict_to_str(data, step)` (verl/utils/logger/aggregate_logger.py):
# "step:N - key:pformat(value) - ...". Ray prefixes worker output with "(TaskRunner pid=N[, ip=...]) " wrapped in
# colour codes (ray/_private/worker.py `print_worker_logs`); numpy 2 scalars print as np.float64(x).
_CONSOLE = re.compile(r"(?:^|[\s)\]])step:(\d+)(\s.*)?$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# pprint of numpy 2 scalars: np.float64(0.5), np.int64(3); torch scalars: tensor(0.5); then an optional note
_WRAPPED = re.compile(r"^\s*(?:np\.\w+|numpy\.\w+|tensor)\(([^()]*)\)(.*)$", re.S)
_BARE = re.compile(r"^\s*(\S+)(.*)$", re.S)


def _console_value(raw: str, last: bool) -> tuple[float | None, str]:
    """(value, appended note) of one console value; None when it is not a number. Only the line's last value
    may carry a note (authors append remarks to a line: `... - perf/throughput:1234.5   <- OOM after this`)."""
    try:
        return float(raw), ""
    except ValueError:
        pass
    if raw.startswith("np.float64(") and raw.endswith(")"):  # the usual numpy 2 value, without a regex
        try:
            return float(raw[11:-1]), ""
        except ValueError:
            pass
    match = _WRAPPED.match(raw) or _BARE.match(raw)
    if not match:
        return None, ""
    number, rest = match.groups()
    try:
        value = float(number)
    except ValueError:
        return None, ""
    rest = rest.strip()
    if rest and not (last and match.group(2)[:1].isspace()):
        return None, ""
    return value, rest


def _console_pairs(text: str) -> tuple[dict[str, float], list[str], str]:
    """Parse " - key:value - key:value": (values, bad pairs, note appended to the last value)."""
    values: dict[str, float] = {}
    bad: list[str] = []
    note = ""
    text = text.strip().removeprefix("-").lstrip()  # " - key:value - ..." (or " -" where a wrap cut it)
    pairs = text.split(" - ") if text else []
    last = len(pairs) - 1
    for i, pair in enumerate(pairs):
        key, sep, raw = pair.partition(":")
        key = key.strip()
        value, rest = _console_value(raw, i == last) if sep and key else (None, "")
        if value is None:
            bad.append(pair)
        else:
            values[key] = value
            note = rest or note
    return values, bad, note


MAX_WRAPPED_LINES = 16  # a 400-character metrics line cut at a 25-column width


def _looks_cut(line: str) -> bool:
    """Does `line` start inside a key:value pair ("ss:0.5 - ..", "34 - ..", "- key:..")? A wrapped step line's
    continuation does; the next log line does not ("Training Progress: ..", "(TaskRunner pid=1) ..")."""
    return line.lstrip().startswith("-") or ":" not in line.split(" - ", 1)[0]


def _wrap_candidate(item: tuple[int, str, bool]) -> bool:
    """Could this line continue a wrapped step line: complete, not blank, not a step line of its own?"""
    _, text, complete = item
    return complete and bool(text.strip()) and not _CONSOLE.search(_ANSI.sub("", text))


def read_console(path: Path, issues: _Issues) -> _Records:
    """verl console metrics (`step:N - key:val - ...`); other lines are ignored, except that a log line naming
    an Ascend device (910B = A2, 910_93 = A3) is remembered for the throughput hardware check. A step line cut at
    a fixed width (a terminal copy, a paste) is joined with the lines that continue it when that mends it."""
    devices = {p.name: p.device_name_patterns for p in PROFILES.values() if p.kind == "npu"}
    out = _Records(path)
    stream = _lines(path, "r")
    ahead: list[tuple[int, str, bool]] = []  # lines read past a step line while looking for its continuation

    def next_line():
        return ahead.pop(0) if ahead else next(stream, None)

    while (item := next_line()) is not None:
        number, line, complete = item
        if "step:" not in line:
            if "910" in line:
                for name, patterns in devices.items():
                    if name not in issues.hardware and any(p in line for p in patterns):
                        issues.hardware[name] = f"{path}:{number}"
            continue
        line = _ANSI.sub("", line).rstrip("\r") if "\x1b" in line else line.rstrip("\r")
        match = _CONSOLE.search(line)
        if not match:
            continue
        where = f"{path}:{number}"
        if not complete:  # no newline: killed while printing, or still running
            issues.truncated[path] = (where, number, "")
            continue
        values, bad, note = _console_pairs(match.group(2) or "")
        joined = 0
        if not ahead and (peek := next(stream, None)) is not None:
            ahead.append(peek)
        if ahead and (bad or not values or line.rstrip().endswith(" -") or _looks_cut(_ANSI.sub("", ahead[0][1]))):
            while (len(ahead) < MAX_WRAPPED_LINES and _wrap_candidate(ahead[-1])
                   and (extra := next(stream, None)) is not None):
                ahead.append(extra)
            text, original, best = line, values, (len(values), -len(bad), 0)
            for k, item in enumerate(ahead, 1):
                if not _wrap_candidate(item):
                    break
                text += _ANSI.sub("", item[1]).rstrip("\r")
                wide = _CONSOLE.search(text)  # re-matched: the cut may fall inside the step number
                if wide is None:
                    break
                wide_values, wide_bad, wide_note = _console_pairs(wide.group(2) or "")
                # keep the join that mends most: more good values, then fewer bad pairs, then a completed value
                score = (len(wide_values), -len(wide_bad), int(not wide_bad and wide_values != original))
                if score > best:
                    best, joined, match, values, bad, note = score, k, wide, wide_values, wide_bad, wide_note
            del ahead[:joined]
        if joined:
            issues.note(where, f"metrics line wrapped over {joined + 1} lines; joined", kind="wrapped")
        if note:
            issues.note(where, f"text after the last value ignored: {note[:60]!r}", kind="appended-note")
        for pair in bad:
            issues.fatal(where, f"corrupt metrics pair {pair[:60]!r}", unit="pairs")
        step = int(match.group(1))
        if not _valid_step(step):
            issues.fatal(where, f"step {match.group(1)[:20]} is out of range", at=(path, number, ""))
            continue
        for key, value in list(values.items()):
            if not math.isfinite(value):
                issues.note(where, f"{key} is {value}; kept", kind="non-finite")
            elif not _in_range(value, where, key, issues):
                del values[key]
        out.add(step, number, values)
    return out


# ---------------------------------------------------------------- TensorBoard
# TFRecord framing of an event file (tensorflow/core/lib/io/record_writer.cc, read the same way by tensorboard's
# compat reader tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py PyRecordReader_New.GetNext): uint64 length,
# masked CRC32C of the length, the data, masked CRC32C of the data, little-endian.
_TF_HEAD, _TF_CRC = 12, 4


def _tfrecords(path: Path, issues: _Issues) -> Iterator[tuple[int, bytes]]:
    """(event number, data) of every record whose CRCs hold. A corrupt record is bad input; under lenient ingest
    it is skipped and reading resumes at the next offset where a whole valid record starts (tensorboard's loader
    stops at the first bad record: one byte flipped mid-file dropped 16 of 30 steps). A partial last record is a
    truncation (the writer was killed), judged like a partial last line.

    Kept instead of tensorboard's EventFileLoader (tensorboard 2.21, backend/event_processing/event_file_loader.py
    over compat/tensorflow_stub/pywrap_tensorflow.py PyRecordReader_New) because, measured on this CPU tier: a
    byte flipped mid-file gave it 14 of 30 steps and no error (here 29 and the corrupt record named); a cut last
    record is dropped silently (here a truncation naming its byte); a CRC-valid length field of 2**60 made it
    read(2**60), a MemoryError (here a bounded check against the file's size); and it is slower: 40,000 scalar
    events (1.7 MB) took it 17-22 s against 3-7 s here (alternating in one process, two rounds; 200,000 events,
    135 s against 9.5-28 s)."""
    import mmap
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open_input(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def record_at(at: int) -> int | None:
        """The record's length if a whole valid record starts at `at`; -1 if it is cut off by the end of file."""
        if at + _TF_HEAD > size:
            return -1
        head = buf[at:at + 8]
        if masked_crc32c(head) != struct.unpack("<I", buf[at + 8:at + _TF_HEAD])[0]:
            return None
        (length,) = struct.unpack("<Q", head)
        end = at + _TF_HEAD + length
        if end + _TF_CRC > size:
            return -1
        return length if masked_crc32c(buf[at + _TF_HEAD:end]) == struct.unpack("<I", buf[end:end + _TF_CRC])[0] \
            else None

    with buf:
        at, number = 0, 0
        while at < size:
            number += 1
            length = record_at(at)
            if length == -1:
                issues.truncated[path] = (f"{path}:byte{at}", number, "event")
                return
            if length is not None:
                yield number, bytes(buf[at + _TF_HEAD:at + _TF_HEAD + length])
                at += _TF_HEAD + length + _TF_CRC
                continue
            resume = None if issues.strict else next(
                (o for o in range(at + 1, size - _TF_HEAD) if (n := record_at(o)) is not None and n >= 0), None)
            issues.fatal(f"{path}:byte{at}", "corrupt TensorBoard record (CRC mismatch); "
                         + (f"{resume - at} bytes skipped, read on from byte {resume}" if resume is not None
                            else "the rest of the file skipped"), at=(path, number, "event"))
            if resume is None:
                return
            at = resume


def read_tensorboard(path: Path, issues: _Issues) -> _Records:
    """Scalars of a TensorBoard event file (verl's tensorboard backend: SummaryWriter.add_scalar per key)."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    by_step: dict[int, tuple[int, dict[str, float]]] = {}
    order: list[tuple[int, int, dict[str, float]]] = []  # (step, event number, values): one record each
    for number, raw in _tfrecords(path, issues):
        where = f"{path}:event{number}"
        try:
            event = event_pb2.Event.FromString(raw)
        except DecodeError as exc:  # valid CRCs around bytes that are no Event
            issues.fatal(where, f"corrupt TensorBoard event ({str(exc)[:80]})", at=(path, number, "event"))
            continue
        if not event.HasField("summary"):
            continue
        if not _valid_step(event.step):
            issues.fatal(where, f"step {event.step} is out of range", at=(path, number, "event"))
            continue
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            try:
                if kind == "simple_value":
                    number_value = float(value.simple_value)
                elif kind == "tensor" and value.tensor.dtype in (1, 2, 19):  # DT_FLOAT, DT_DOUBLE, DT_HALF
                    tensor = tensor_util.make_ndarray(value.tensor)
                    if tensor.size != 1:
                        continue  # histograms/images are not metric series
                    number_value = float(tensor.reshape(()))
                else:
                    continue
            except (ValueError, TypeError) as exc:  # a tensor whose content does not match its shape
                issues.fatal(where, f"{value.tag}: corrupt tensor ({str(exc)[:60]})", unit="pairs")
                continue
            if not math.isfinite(number_value):
                issues.note(where, f"{value.tag} is {number_value}; kept", kind="non-finite")
            elif not _in_range(number_value, where, value.tag, issues):
                continue
            record = by_step.get(event.step)
            if record is None or value.tag in record[1]:  # a repeated step starts a new record
                record = (number, {})
                by_step[event.step] = record
                order.append((event.step, number, record[1]))
            record[1][value.tag] = number_value
    out = _Records(path, unit="event")
    for step, number, values in order:
        out.add(step, number, values)
    return out


# ---------------------------------------------------------------- wandb CSV export
_STEP_COLUMNS = ("_step", "Step", "step", "global_step", "trainer/global_step")
_WANDB_META = ("_runtime", "_timestamp", "_wandb")
_SURROGATE = re.compile("[\udc80-\udcff]")  # undecodable bytes, kept by errors="surrogateescape"


def _csv_rows(path: Path, issues: _Issues) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of a CSV, streamed; non-UTF-8 bytes and cells over the csv module's field limit are
    bad input naming the line. The standard csv module parses; pandas' read_csv is installed here but is no
    dependency the harness may declare (pandas belongs to the stack it tests: tests/test_packaging.py STACK)."""
    # utf-8-sig: a BOM (Excel's CSV export writes one) made the header's first cell "\ufeff_step": "no step column"
    with open_input(path, "r", newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        reader = csv.reader(f)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                issues.fatal(f"{path}:{reader.line_num}", f"unreadable CSV row ({exc})", at=(path, reader.line_num, ""))
                if reader.line_num <= 1:
                    raise BadInput(f"{path}:1: unreadable CSV header ({exc})") from None
                continue
            if _SURROGATE.search("".join(row)):
                issues.fatal(f"{path}:{reader.line_num}", "bytes that are not UTF-8; export the CSV as UTF-8",
                             at=(path, reader.line_num, ""))
                if reader.line_num <= 1:
                    raise BadInput(f"{path}:1: the header has bytes that are not UTF-8; export the CSV as UTF-8")
                continue
            yield reader.line_num, row


def _csv_step(cell: str) -> int | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value.is_integer() and 0 <= value < MAX_STEP else None


def read_wandb_csv(path: Path, issues: _Issues) -> _Records:
    """A wandb CSV export: `run.history().to_csv()` (_step, _runtime, _timestamp, metrics) or the UI export
    ("Step", "<run> - metric", "<run> - metric__MIN/__MAX"). One run per file. Another CSV with a step column is
    read too (one metric per column) with a warning that it is not a wandb export."""
    rows = _csv_rows(path, issues)
    first = next(rows, None)
    if first is None:
        raise BadInput(f"{path}: empty CSV; export the run's history from wandb")
    _, header = first
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
    seen: dict[str, int] = {}
    for i, name in columns.items():
        if name in seen:  # silently letting the last column win would be a wrong result
            raise BadInput(f"{path}:1: column {name!r} appears twice (columns {seen[name] + 1} and {i + 1}); "
                           "export each metric once")
        seen[name] = i
    wandb = any(c.startswith(_WANDB_META) for c in header) or header[step_col] == "_step" or (
        header[step_col] == "Step" and prefixes)
    if not wandb:
        issues.note(f"{path}:1", f"not a wandb export (no _step/_runtime/_timestamp column, no \"<run> - <metric>\" "
                                 f"columns); read as step column {header[step_col]!r} and one metric per column",
                    kind="not-wandb")
    out = _Records(path)
    for number, row in rows:
        where = f"{path}:{number}"
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            issues.fatal(where, f"corrupt row: {len(row)} cells, header has {len(header)}", at=(path, number, ""))
            continue
        step = _csv_step(row[step_col])
        if step is None:
            issues.fatal(where, f"step {row[step_col][:40]!r} is not a whole number in [0, 2^62)",
                         at=(path, number, ""))
            continue
        values = {}
        for i, name in columns.items():
            cell = row[i].strip()
            if not cell:
                continue  # wandb leaves a cell empty when the metric was not logged at that step
            try:
                value = float(cell)
            except ValueError:
                issues.fatal(where, f"{name} is {cell[:40]!r}, not a number", unit="pairs")
                continue
            if not math.isfinite(value):
                issues.note(where, f"{name} is {value}; kept", kind="non-finite")
            elif not _in_range(value, where, name, issues):
                continue
            values[name] = value
        out.add(step, number, values)
    return out


# ---------------------------------------------------------------- verl Ascend nightly baseline summary
# verl's Ascend nightly (verl-project/verl .github/workflows/nightly_ascend.yml) checks each job's console log
# against a baseline text file (`check_npu.py --log LOG --base baseline_*.txt`): one `key: value` line per
# metric, the metric's mean over steps 5-14 of the baseline job.
_SUMMARY_LINE = re.compile(r"^\s*([^\s:#][^:]*?)\s*:\s+(\S+)\s*$")
NIGHTLY_WINDOW = (5, 14)
NIGHTLY_STATISTIC = "mean of steps 5-14 (verl Ascend nightly)"


def is_summary_file(path: str | Path) -> bool:
    """A text file (not jsonl/csv/json/events) whose first 50 lines are all `key: number` (or blank/comments)."""
    path = Path(path)
    if not path.is_file() or _kind(path) != "console":
        return False
    seen = False
    with open_input(path, "r", encoding="utf-8-sig", errors="replace") as f:
        for line in itertools.islice(f, 50):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = _SUMMARY_LINE.match(line)
            if not match or _CONSOLE.search(line):
                return False
            try:
                float(match.group(2))
            except ValueError:
                return False
            seen = True
    return seen


def load_summary(path: str | Path) -> Summary:
    """A verl Ascend nightly baseline summary: `key: value` per line (`#` comments and blank lines allowed)."""
    path = Path(path)
    values: dict[str, float] = {}
    try:
        stream = list(_lines(path, "r"))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror}); pass the nightly baseline summary file") from None
    for number, line, _ in stream:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _SUMMARY_LINE.match(line)
        try:
            value = float(match.group(2)) if match else math.nan
        except ValueError:
            value = math.nan
        if not match or not is_metric_value(value):
            raise BadInput(f"{path}:{number}: not a `key: value` line with a finite number within "
                           f"+-{METRIC_LIMIT:g} ({line.strip()[:60]!r})")
        key = match.group(1)
        if key in values:
            raise BadInput(f"{path}:{number}: {key!r} appears twice; keep one value per metric")
        values[key] = value
    if not values:
        raise BadInput(f"{path}: no `key: value` lines; is this a verl nightly baseline summary?")
    return Summary(name=path.stem, values=values, statistic=NIGHTLY_STATISTIC, window=NIGHTLY_WINDOW,
                   source=str(path))


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
        if path.is_file() and not path.name.startswith(".") and not is_summary_file(path):
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


@dataclass(frozen=True)
class _Segment:
    """Records [start, end) of one file whose steps never go back (a resumed job appending restarts one)."""

    file: _Records
    start: int
    end: int
    steps: np.ndarray  # the segment's steps, duplicates removed

    def first_where(self) -> str:
        return self.file.where(self.start)


def _segments(records: _Records, keep: np.ndarray, issues: _Issues) -> list[_Segment]:
    """Split one file where the step goes back; a step repeated within a segment is a duplicate (the first record
    of the step is kept under lenient ingest, `keep` is cleared for the others)."""
    steps = np.frombuffer(records.steps, dtype=np.int64)
    diff = np.diff(steps)
    for dup in (np.flatnonzero(diff == 0) + 1).tolist():
        issues.fatal(records.where(dup), f"duplicate step {steps[dup]} (also at {records.where(dup - 1)})")
        keep[dup] = False
    bounds = [0, *(np.flatnonzero(diff < 0) + 1).tolist(), len(steps)]
    return [_Segment(records, a, b, steps[a:b][keep[a:b]]) for a, b in itertools.pairwise(bounds)]


def _assemble(files: list[_Records], issues: _Issues) -> dict[str, Series]:
    # Files come in any order: order them by first step. Within a file a later segment (a resumed job
    # appending to the same console log) stays after the earlier one and wins where steps repeat.
    files = sorted(files, key=lambda f: f.steps[0])
    for a, b in itertools.pairwise(files):
        if a.steps[0] == b.steps[0]:
            raise BadInput(f"{b.where(0)}: starts at step {b.steps[0]} like {a.where(0)}; logs of two different "
                           "runs? pass the segments of one run only")
    for path, (where, position, unit) in issues.truncated.items():
        # The job that was killed mid-line and then resumed left a truncated earlier segment: expected.
        if path != files[-1].path:
            issues.note(where, "truncated last record of a segment the resumed job continued; partial record skipped")
        else:
            issues.fatal(where, "truncated last record (the job was killed while writing, or is still running)",
                         "wait for the job to finish or remove the partial line", at=(path, position, unit))
    keep = {id(f): np.ones(len(f), dtype=bool) for f in files}
    segments = [seg for f in files for seg in _segments(f, keep[id(f)], issues)]
    earlier = np.empty(0, dtype=np.int64)
    for i, seg in enumerate(segments):
        repeated = np.intersect1d(seg.steps, earlier)
        if repeated.size:
            issues.note(seg.first_where(), f"resumed run: steps {repeated[0]}..{repeated[-1]} logged again; these "
                        "values replace the earlier ones", kind="resumed")
        elif i and segments[i - 1].file is seg.file:
            issues.note(seg.first_where(), f"step {seg.steps[0] if seg.steps.size else '?'} after step "
                        f"{segments[i - 1].steps[-1] if segments[i - 1].steps.size else '?'}: steps out of order "
                        "in one file; merged by step", kind="out-of-order")
        earlier = np.union1d(earlier, seg.steps) if len(segments) > 1 else earlier
    if len(segments) > 1:  # an earlier segment's record is dropped where a later segment logs its step again
        later = np.empty(0, dtype=np.int64)
        for seg in reversed(segments):
            mask = keep[id(seg.file)][seg.start:seg.end]
            steps = np.frombuffer(seg.file.steps, dtype=np.int64)[seg.start:seg.end]
            mask &= ~np.isin(steps, later)
            later = np.union1d(later, seg.steps)
    return _columns(files, keep)


def _columns(files: list[_Records], keep: dict[int, np.ndarray]) -> dict[str, Series]:
    """Per metric: the kept (step, value) pairs of every file, ordered by step, as Series. Series with the same
    steps share one steps tuple. Each column's arrays are released once its Series is built, and the usual case
    (one file, nothing dropped, a metric logged from the first record on) converts the arrays straight into
    tuples: the peak stays near the size of the Series themselves."""
    f = files[0]
    if len(files) > 1 or not keep[id(f)].all() or not (np.diff(np.frombuffer(f.steps, dtype=np.int64)) > 0).all():
        return _columns_general(files, keep)
    order = list(f.columns)
    full = None
    series = {}
    for key in order:
        column = f.columns[key]
        if column.index is None and column.first == 0 and len(column.values) == len(f):
            full = full or tuple(f.steps)
            series[key] = Series(full, tuple(f.columns.pop(key).values))
    series.update(_columns_general(files, keep))
    return {key: series[key] for key in order if key in series}


def _columns_general(files: list[_Records], keep: dict[int, np.ndarray]) -> dict[str, Series]:
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for f in files:
        steps = np.frombuffer(f.steps, dtype=np.int64)
        mask = keep[id(f)]
        for key, column in f.columns.items():
            records = column.records()
            kept = mask[records]
            values = np.frombuffer(column.values, dtype=np.float64)
            if kept.any():  # a metric logged only in records lenient ingest dropped has no series
                pieces.setdefault(key, []).append((steps[records][kept], values[kept]))
    shared: dict[bytes, tuple[int, ...]] = {}
    series = {}
    for key, parts in pieces.items():
        steps = np.concatenate([s for s, _ in parts]) if len(parts) > 1 else parts[0][0]
        values = np.concatenate([v for _, v in parts]) if len(parts) > 1 else parts[0][1]
        if steps.size > 1 and not (np.diff(steps) > 0).all():
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
        raw = steps.tobytes()
        if raw not in shared:
            shared[raw] = tuple(steps.tolist())
        series[key] = Series(shared[raw], tuple(values.tolist()))
    return series


def _meta_field(meta_path: Path, fields: dict, key: str, kinds: tuple, what: str):
    value = fields.get(key)
    if value is not None and (type(value) not in kinds or (key == "devices" and not 1 <= value <= MAX_COUNT)):
        raise BadInput(f"{meta_path}: \"{key}\" is {json.dumps(value)[:40]}, not {what}; fix or remove it")
    return value


def _meta(paths: list[Path], sources: list[Path], issues: _Issues) -> RunMeta:
    fields: dict = {}
    meta_path = None
    for p in paths:
        candidate = p / META_FILE if p.is_dir() else p.parent / META_FILE
        if candidate.is_file():
            meta_path = candidate
            # hand-written meta.json files (no schema) are accepted: name, scale, hardware, devices, versions
            fields = dict(read_versioned(candidate, schema=RUN_META_SCHEMA, version=RUN_META_VERSION,
                                         what="run meta.json", hint="rewrite or remove it", missing="vanished",
                                         unversioned_ok=True))
            fields.pop("schema", None)
            fields.pop("schema_version", None)
            break
    if meta_path is not None:
        _meta_field(meta_path, fields, "name", (str,), "a string")
        _meta_field(meta_path, fields, "scale", (str,), "a scale name")
        _meta_field(meta_path, fields, "hardware", (str,), "a hardware name")
        _meta_field(meta_path, fields, "devices", (int,), "a positive whole number of torch devices")
        versions = _meta_field(meta_path, fields, "versions", (dict,), "an object of package: version")
        if versions and not all(isinstance(v, str) for v in versions.values()):
            raise BadInput(f"{meta_path}: \"versions\" must map package names to version strings")
    if "config" not in fields:
        config = _hydra_config([p if p.is_dir() else p.parent for p in paths])
        if config is not None:
            fields["config"] = config
    known = {k: v for k in ("scale", "hardware", "devices", "versions") if (v := fields.pop(k, None)) is not None}
    return RunMeta(**known, sources=tuple(map(str, sources)), extra=fields, warnings=tuple(issues.summary()),
                   skipped_lines=issues.skipped["lines"], skipped_pairs=issues.skipped["pairs"],
                   hardware_in_logs=dict(issues.hardware))


MAX_CONFIG_BYTES = 4 << 20  # verl's resolved config is ~30 KiB


def _hydra_config(dirs: list[Path]) -> dict | None:
    """verl's resolved config as its Hydra run wrote it (HYDRA_CONFIG in a run directory: the launcher points
    hydra.run.dir there), or None; a file that is not a YAML mapping is one line naming it."""
    import yaml

    for directory in dirs:
        path = directory / HYDRA_CONFIG
        if not path.is_file():
            continue
        try:
            with open_input(path) as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise BadInput(f"{path}: more than {MAX_CONFIG_BYTES >> 20} MiB, not verl's resolved config; remove it")
        try:
            doc = yaml.safe_load(raw.decode("utf-8-sig", errors="replace"))
        except yaml.YAMLError as exc:
            raise BadInput(f"{path}: not YAML ({str(exc).splitlines()[0]}); remove it or rerun the job") from None
        if not isinstance(doc, dict):
            raise BadInput(f"{path}: not a mapping of verl's config sections; remove it or rerun the job")
        return doc
    return None


def run_sources(path: str | Path, issues: _Issues | None = None) -> list[Path]:
    """The log files a run path stands for (a log file itself, or the verl logs in a run directory), without
    reading them; BadInput for a missing path, a directory without logs, or a nightly summary."""
    p = Path(path)
    if p.is_dir():
        return _run_files(p, issues or _Issues(strict=False))
    if not p.is_file():
        kind = file_kind(p)  # a FIFO would block the read, a device (/dev/zero) never end it
        raise BadInput(f"{p}: " + ("no such file or directory" if kind is None else f"a {kind}, not a regular file")
                       + "; pass verl log files or run directories")
    if is_summary_file(p):
        raise BadInput(f"{p}: a verl nightly baseline summary (`key: value` per metric), not a run log; "
                       "pass it as the BASELINE")
    return [p]


def load_run(*paths: str | Path, name: str | None = None, strict: bool = True) -> Run:
    """Ingest one run from log files and/or run directories (several = segments of one resumed run).

    Raises BadInput naming file:line for a missing path, a truncated/corrupt line or value or a duplicate step
    (unless strict=False, which skips the bad part and keeps it as `run.meta.warnings`). Metadata comes from
    `meta.json` beside the logs when present.
    """
    if not paths:
        raise BadInput("no run given: pass log files or run directories")
    issues = _Issues(strict)
    resolved = [Path(p) for p in paths]
    sources = [source for p in resolved for source in run_sources(p, issues)]
    read = []
    for p in sources:
        try:
            records = READERS[_kind(p)](p, issues)
        except OSError as exc:
            raise BadInput(f"{p}: cannot read ({exc.strerror or exc}); pass a readable log file") from None
        if len(records):
            read.append(records)
    if not read:
        raise BadInput(f"{', '.join(map(str, sources))}: no metric records (no `step` lines); is this a verl log?")
    series = _assemble(read, issues)
    issues.resolve_dropped(read)
    if not series:
        raise BadInput(f"{', '.join(map(str, sources))}: its step records hold no metric values; is this a verl log?")
    default_name = resolved[0].name if resolved[0].is_dir() else resolved[0].stem
    meta = _meta(resolved, sources, issues)
    return Run(name or meta.extra.pop("name", None) or default_name, series, meta)
