"""Reading the JSON files users point at, with one-line errors, and writing results atomically: a result is
written to a temporary file beside the target and renamed into place, so a crash or a full disk never leaves a
half-written report, baseline or run file.

Every file the harness writes for later reading (baselines, reports, a run's meta.json, the launcher's
launch.json) carries `schema` and `schema_version`; `read_versioned` is the one loader, and it refuses a
version it does not know with a message saying what to do.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from harness.errors import BadInput


def read_json(path: str | os.PathLike, *, missing: str, corrupt: str = "truncated or corrupt; write it again"):
    """Parse a JSON file the user pointed at; BadInput names the file and what to do when it is absent
    (`missing`) or not JSON (`corrupt`)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise BadInput(f"{path}: {missing}") from None
    except ValueError as exc:
        raise BadInput(f"{path}: not JSON ({exc}); {corrupt}") from None


def check_version(doc, source: str, *, schema: str, version: int, what: str, hint: str,
                  unversioned_ok: bool = False) -> dict:
    """`doc` if it is a JSON object of `schema` at `version`; BadInput naming `source` otherwise. `hint` says
    how to get a readable file (re-record, regenerate). `unversioned_ok`: a hand-written file without a
    `schema` key is accepted as is (a run's meta.json)."""
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: not an ascend-rl-harness {what} (a JSON object expected); {hint}")
    if unversioned_ok and "schema" not in doc:
        return doc
    if doc.get("schema") != schema:
        raise BadInput(f"{source}: not an ascend-rl-harness {what} (no \"schema\": \"{schema}\"); {hint}")
    if doc.get("schema_version") != version:
        raise BadInput(f"{source}: {what} schema_version {doc.get('schema_version')!r} is not supported (this harness "
                       f"reads version {version}); {hint}")
    return doc


def read_versioned(path: str | os.PathLike, *, schema: str, version: int, what: str, hint: str, missing: str,
                   unversioned_ok: bool = False) -> dict:
    """Read a file the harness wrote (`schema` at `version`): `read_json` + `check_version`."""
    doc = read_json(path, missing=missing, corrupt=hint)
    return check_version(doc, str(path), schema=schema, version=version, what=what, hint=hint,
                         unversioned_ok=unversioned_ok)


def versioned(schema: str, version: int, doc: dict) -> dict:
    """`doc` stamped with its schema and version (first, so a reader sees them at the top of the file)."""
    return {"schema": schema, "schema_version": version, **doc}


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj, *, indent: int = 2) -> Path:
    return write_atomic(path, json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False) + "\n")
