"""Reading the JSON files users point at, with one-line errors, and writing results atomically: a result is
written to a temporary file beside the target and renamed into place, so a crash or a full disk never leaves a
half-written report, baseline or run file.

Every file the harness writes for later reading (baselines, reports, a run's meta.json, the launcher's
launch.json) carries `schema` and `schema_version`; `read_versioned` is the one loader, and it refuses a
version it does not know with a message saying what to do.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

from harness.errors import BadInput

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of a UTF-16 surrogate


def read_json(path: str | os.PathLike, *, missing: str, corrupt: str = "truncated or corrupt; write it again"):
    """Parse a JSON file the user pointed at; BadInput names the file and what to do when it is absent
    (`missing`) or not JSON (`corrupt`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # rare: only then look for a lone surrogate, which no output can encode
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        return doc
    except UnicodeEncodeError:  # "\ud800" parses, but is no character: printing or writing it fails later
        raise BadInput(f"{path}: holds a lone UTF-16 surrogate (\\ud800-\\udfff), not text; {corrupt}") from None
    except (FileNotFoundError, IsADirectoryError):
        raise BadInput(f"{path}: {missing}") from None
    except ValueError as exc:  # also UnicodeDecodeError: non-UTF-8 bytes
        raise BadInput(f"{path}: not JSON ({exc}); {corrupt}") from None
    except RecursionError:  # nesting deeper than the parser's stack (a property-generated input)
        raise BadInput(f"{path}: not JSON (nested too deep); {corrupt}") from None


def check_version(doc, source: str, *, schema: str, version: int | tuple[int, ...], what: str, hint: str,
                  unversioned_ok: bool = False) -> dict:
    """`doc` if it is a JSON object of `schema` at `version` (or one of several: a reader that still loads the
    older layout); BadInput naming `source` otherwise. `hint` says how to get a readable file (re-record,
    regenerate). `unversioned_ok`: a hand-written file without a `schema` key is accepted as is (a run's
    meta.json)."""
    versions = version if isinstance(version, tuple) else (version,)
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: not an ascend-rl-harness {what} (a JSON object expected); {hint}")
    if unversioned_ok and "schema" not in doc:
        return doc
    if doc.get("schema") != schema:
        raise BadInput(f"{source}: not an ascend-rl-harness {what} (no \"schema\": \"{schema}\"); {hint}")
    found = doc.get("schema_version")
    if isinstance(found, bool) or found not in versions:  # True == 1 in Python; a JSON true is no version
        readable = " or ".join(map(str, versions))
        raise BadInput(f"{source}: {what} schema_version {found!r} is not supported (this harness "
                       f"reads version {readable}); {hint}")
    return doc


def read_versioned(path: str | os.PathLike, *, schema: str, version: int | tuple[int, ...], what: str,
                   hint: str, missing: str, unversioned_ok: bool = False) -> dict:
    """Read a file the harness wrote (`schema` at `version`): `read_json` + `check_version`."""
    doc = read_json(path, missing=missing, corrupt=hint)
    return check_version(doc, str(path), schema=schema, version=version, what=what, hint=hint,
                         unversioned_ok=unversioned_ok)


def versioned(schema: str, version: int, doc: dict) -> dict:
    """`doc` stamped with its schema and version (first, so a reader sees them at the top of the file)."""
    return {"schema": schema, "schema_version": version, **doc}


# A temporary file this old is left over from a killed writer (issue 16: 56 MB of hidden .tmp files were seen);
# a live writer finishes long before.
STALE_TMP_S = 3600


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (os.umask can only be read by setting it,
    which races with other threads creating files, e.g. Ray's)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# what write_atomic's mkstemp names look like: ".<target name>.<8 random chars>.tmp"
_TMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


def clean_stale_tmp(directory: str | os.PathLike, older_than_s: float = STALE_TMP_S) -> list[Path]:
    """Remove the hidden temporaries `write_atomic` left in `directory` when a writer was killed (for any
    target: a trend store's entries each have their own name); returns them."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if _TMP_NAME.match(tmp.name) and time.time() - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
                removed.append(tmp)
    return removed


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike):
    """Yields a temporary path beside `path` for a writer that takes a file name (safetensors, DataProto); on a
    clean exit it is renamed onto `path`, otherwise removed. The file gets the mode a plain open() would give
    (0666 less the umask; issue 16: mkstemp's 0600 made shared reports unreadable), and temporaries of earlier
    killed writers in the directory are cleaned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary file renamed into place (see atomic_target)."""
    mode = "wb" if isinstance(data, bytes) else "w"
    with atomic_target(path) as tmp:
        # backslashreplace: a JSON string may hold a lone surrogate ("\ud800" is valid JSON, not valid UTF-8); a
        # page shows it escaped instead of the write failing with a traceback (issue 16)
        with open(tmp, mode, **({} if mode == "wb" else {"encoding": "utf-8", "errors": "backslashreplace"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json_atomic(path: str | os.PathLike, obj, *, indent: int = 2) -> Path:
    return write_atomic(path, json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False) + "\n")


_HELD: dict[Path, int] = {}  # directories this process holds, with how many nested holders


@contextlib.contextmanager
def exclusive(directory: str | os.PathLike, what: str):
    """Hold DIR/.lock (fcntl) for the block, or refuse with one line: two writers of one directory would
    overwrite each other's files silently (issue 16). The lock dies with the process, so a killed run never
    leaves it stuck. Re-entrant within one process: `run` holds it, and the report collector of the pytest
    session `run` starts in-process takes it again (a plain `pytest --report-dir` takes it alone)."""
    import fcntl

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield directory
        finally:
            _HELD[key] -= 1
        return
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise BadInput(f"{directory}: {what} is in use by {holder}; wait for it or choose another "
                           "directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        _HELD[key] = 1
        try:
            yield directory
        finally:
            del _HELD[key]
    finally:
        os.close(fd)
