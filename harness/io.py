"""Reading user-supplied JSON with one-line errors, and atomic file writes: results are written to a temporary file beside the target and renamed into place,
so a crash or a full disk never leaves a half-written report, baseline or run file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def read_json(path: str | os.PathLike, *, missing: str, corrupt: str = "truncated or corrupt; write it again"):
    """Parse a JSON file the user pointed at; BadInput names the file and what to do when it is absent
    (`missing`) or not JSON (`corrupt`)."""
    from harness.errors import BadInput

    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise BadInput(f"{path}: {missing}") from None
    except ValueError as exc:
        raise BadInput(f"{path}: not JSON ({exc}); {corrupt}") from None


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
