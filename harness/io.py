"""Reading the JSON files users point at, with one-line errors, and writing results atomically: a result is
written to a temporary file beside the target and renamed into place, so a crash or a full disk never leaves a
half-written report, baseline or run file. A writer that must not replace a file links its temporary into place
(`overwrite=False`), so of two racing writers exactly one wins; a write that fails (ENOSPC, EROFS, EACCES,
ENAMETOOLONG) is one line naming the file.

Inputs are regular files: `open_input` refuses a FIFO (open() would block until a writer comes), a device
(/dev/zero never ends) or a link to one before reading, and a whole-file read is bounded (MAX_JSON_BYTES).
Locks are filelock's (`held`), never taken through a symbolic link planted in their place (a root run overwrote
its target).

Every file the harness writes for later reading (baselines, reports, a run's meta.json, the launcher's
launch.json) carries `schema` and `schema_version`; `read_versioned` is the one loader, and it refuses a
version it does not know with a message saying what to do.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from harness.errors import BadInput, NewerVersion

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of a UTF-16 surrogate
BOM = "\ufeff".encode()  # the UTF-8 byte-order mark editors and Excel put first; every text reader accepts it
MAX_JSON_BYTES = 256 << 20  # a report, golden or meta.json is far smaller; a bigger "JSON" is read into memory
_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
          (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def file_kind(path: str | os.PathLike) -> str | None:
    """What `path` is, following links: "regular file", "directory", "FIFO", "character device", ... or None when
    nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return "unreadable path"
    return next((kind for test, kind in _KINDS if test(mode)), "regular file")


def open_input(path: str | os.PathLike, mode: str = "rb", **kwargs):
    """`open(path, mode)` for reading, refusing anything but a regular file before a byte is read: a FIFO
    (opened non-blocking, so no writer is waited for), a device, a socket, or a link to one. BadInput names it;
    FileNotFoundError / IsADirectoryError propagate as open() raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "special file")
            raise BadInput(f"{path}: a {kind}, not a regular file; pass the file itself")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def refuse_input(out: str | os.PathLike, inputs, option: str) -> Path:
    """`out` when writing it cannot touch an input: BadInput naming `option` when it is one of `inputs` (the same
    file, through any link), or an existing file inside an input directory (a run directory's metrics.jsonl,
    meta.json, logs). `compare --plot` onto the candidate's metrics.jsonl and `baseline record --out` onto one of
    its runs overwrote the very data they read."""
    target = Path(out)
    if not target.exists():
        return target
    real = target.resolve()
    for given in inputs:
        source = Path(given)
        try:
            same = source.exists() and (real.is_relative_to(source.resolve()) if source.is_dir()
                                        else os.path.samefile(source, target))
        except OSError:
            same = False
        if same:
            raise BadInput(f"{option} {out}: is one of the inputs ({given}); write to a new file")
    return target


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def read_json(path: str | os.PathLike, *, missing: str, corrupt: str = "truncated or corrupt; write it again"):
    """Parse a JSON file the user pointed at; BadInput names the file and what to do when it is absent
    (`missing`), no regular file, bigger than MAX_JSON_BYTES, or not JSON (`corrupt`). A BOM is accepted."""
    path = Path(path)
    try:
        with open_input(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(MAX_JSON_BYTES + 1)
        if max(size, len(raw)) > MAX_JSON_BYTES:
            raise BadInput(f"{path}: {size_text(max(size, len(raw)))}, more than the {size_text(MAX_JSON_BYTES)} a "
                           "harness JSON file can be; is it the right file?")
        text = raw.decode("utf-8-sig")
        doc = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # rare: only then look for a lone surrogate, which no output can encode
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        return doc
    except UnicodeEncodeError:  # "\ud800" parses, but is no character: printing or writing it fails later
        raise BadInput(f"{path}: holds a lone UTF-16 surrogate (\\ud800-\\udfff), not text; {corrupt}") from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise BadInput(f"{path}: {missing}") from None
    except PermissionError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
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
        newer = type(found) is int and found > max(versions)
        raise (NewerVersion if newer else BadInput)(
            f"{source}: {what} schema_version {found!r} is not supported (this harness reads version {readable}"
            f"{'; it was written by a newer version of ascend-rl-harness' if newer else ''}); {hint}")
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


# A temporary file this old is left over from a killed writer (56 MB of hidden .tmp files were once seen);
# a live writer finishes long before.
STALE_TMP_S = 3600


def current_umask() -> int:
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


# What a full, read-only or denied file system says: one line naming the file and what to do, exit 2.
_WRITE_HINTS = {errno.ENOSPC: "free space or choose another directory", errno.EDQUOT: "free space (quota)",
                errno.EROFS: "choose a writable directory", errno.EACCES: "choose a directory you can write",
                errno.EPERM: "choose a directory you can write", errno.ENAMETOOLONG: "choose a shorter name",
                errno.ELOOP: "remove the link", errno.ENOTDIR: "a part of the path is a file, not a directory"}
WRITE_ERRNOS = frozenset(_WRITE_HINTS)


def write_error(path: str | os.PathLike, exc: OSError) -> BadInput:
    """The one-line BadInput for an OSError met writing `path` (ENOSPC, EROFS, EACCES, ENAMETOOLONG, ...)."""
    hint = _WRITE_HINTS.get(exc.errno, "check the path")
    return BadInput(f"{path}: cannot write ({exc.strerror or exc}); {hint}")


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike, *, overwrite: bool = True, exists: str = "choose another name"):
    """Yields a temporary path beside `path` for a writer that takes a file name (safetensors, DataProto); on a
    clean exit it is renamed onto `path`, otherwise removed. The file gets the mode a plain open() would give
    (0666 less the umask; mkstemp's 0600 made shared reports unreadable), and temporaries of earlier
    killed writers in the directory are cleaned. `overwrite=False`: the temporary is hard-linked to `path`, which
    fails if it exists -- atomic against another writer (checking first, then writing, let two `baseline record`s
    both succeed and the first golden be lost); BadInput "already exists; `exists`". An OSError of the file system
    (full, read-only, denied, name too long) becomes BadInput naming `path`; mkstemp never follows a planted
    link (O_EXCL) and the rename replaces a link, never its target.

    Ours, not a library's: atomicwrites, the one that did this job, is archived and unmaintained since 2022 (its
    README; untitaker/python-atomicwrites issue 61), its author pointing to os.replace, which this is, plus the
    umask mode, the stale temporaries and the one-line errors above."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_tmp(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~current_umask())
        os.close(fd)
        yield Path(tmp)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise BadInput(f"{path}: already exists; {exists}") from None
            finally:
                os.unlink(tmp)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if exc.errno in WRITE_ERRNOS:
            raise write_error(path, exc) from None
        raise
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes, *, overwrite: bool = True,
                 exists: str = "choose another name") -> Path:
    """Write `data` to `path` through a temporary file renamed into place (see atomic_target)."""
    mode = "wb" if isinstance(data, bytes) else "w"
    with atomic_target(path, overwrite=overwrite, exists=exists) as tmp:
        # backslashreplace: a JSON string may hold a lone surrogate ("\ud800" is valid JSON, not valid UTF-8); a
        # page shows it escaped instead of the write failing with a traceback
        with open(tmp, mode, **({} if mode == "wb" else {"encoding": "utf-8", "errors": "backslashreplace"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json_atomic(path: str | os.PathLike, obj, *, indent: int = 2, overwrite: bool = True,
                      exists: str = "choose another name") -> Path:
    return write_atomic(path, json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False) + "\n",
                        overwrite=overwrite, exists=exists)


def open_lock(path: str | os.PathLike) -> int:
    """An fd of the lock file `path` for fcntl.flock, created if absent (0666 less the umask), never through a
    symbolic link planted in its place (O_NOFOLLOW: as root, a planted `.lock -> /etc/passwd` was truncated).
    BadInput for a link or a file system that refuses the file. Only for the overlay builder
    (harness.gate.overlays), whose lock file is renamed while held, which filelock cannot do; every other lock
    is `held`."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~current_umask())
    except OSError as exc:
        raise _lock_error(path, exc) from None


def _lock_error(path, exc: OSError) -> Exception:
    if exc.errno == errno.ELOOP:
        return BadInput(f"{path}: is a symbolic link, not a lock file; remove it (a lock is never followed)")
    return write_error(path, exc) if exc.errno in WRITE_ERRNOS else exc


@contextlib.contextmanager
def held(path: str | os.PathLike, *, busy: str | None = None):
    """Hold the lock file `path` (filelock: flock, dies with the process, so a killed run never leaves it stuck)
    for the block: waiting for it, or with `busy` refusing at once with BadInput "`busy` in use by <holder>".
    Re-entrant within one process (one FileLock per path): `run` holds its report directory and the collector of
    the pytest session it starts in-process takes it again. The holder writes "pid N" into the file for the
    refusal to name: filelock 4 leaves a held file's content alone; 3.x opens it with O_TRUNC on every try
    (tox-dev/filelock src/filelock/_unix.py UnixFileLock._acquire), so under 3.20.1 the refusal says "another
    process" (run so: the two pid tests fail, the link tests pass). Never through a planted link: filelock >=
    3.20.1 opens with O_NOFOLLOW (tox-dev/filelock PR 461, CVE-2025-68146; as root, a planted `.lock ->
    /etc/passwd` was truncated), and the ELOOP it raises is one line here."""
    from filelock import FileLock, Timeout

    lock = FileLock(path, timeout=-1 if busy is None else 0, is_singleton=True, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise BadInput(f"{busy} in use by {_holder(path)}; wait for it or choose another directory") from None
    except OSError as exc:
        raise _lock_error(path, exc) from None
    try:
        if lock.lock_counter == 1:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
                finally:
                    os.close(fd)
        yield
    finally:
        lock.release()


def _holder(path) -> str:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
    return "another process"


@contextlib.contextmanager
def exclusive(directory: str | os.PathLike, what: str):
    """Hold DIR/.lock (`held`) for the block, or refuse with one line naming the holder: two writers of one
    directory would overwrite each other's files silently."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS or exc.errno == errno.EEXIST:
            raise write_error(directory, exc) from None
        raise
    with held(directory.resolve() / ".lock", busy=f"{directory}: {what} is"):
        yield directory


def cache_root() -> Path:
    """The harness's cache: $HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/ascend-rl-harness (~/.cache by default)."""
    base = os.environ.get("HARNESS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ascend-rl-harness")
    return Path(base)
