"""The harness's errors: one root, `HarnessError`, whose message is one line the user reads (the CLI catches
the root once and exits 2). Bad input names the file (with :line where it applies) or the option, and what
to do; nothing else is printed, no traceback. Signals end a command like a tool a signal stopped (Terminated,
exit_code)."""
from __future__ import annotations

import contextlib


class HarnessError(Exception):
    """Root of every error the harness raises on purpose; the message is one line naming what to fix."""


class BadInput(HarnessError):
    """Input the harness cannot use: a truncated log, a missing baseline, a wrong config, a missing package."""


class NewerVersion(BadInput):
    """A file written by a newer ascend-rl-harness (a schema version above the ones this one reads): never corrupt,
    so a trend store skips it instead of quarantining it from the version that can read it."""


class PlanError(BadInput):
    """An invalid parallel plan; the message names the violated rule and the numbers."""


class RecipeError(BadInput):
    """A DAPO recipe verl rejects: the message names the override key (or config section) and verl's reason."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class HardwareError(HarnessError):
    """A device stack that is present but unusable (e.g. torch_npu installed without CANN)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C (pytest and every `finally` treat it so: the report set is not swapped
    in, temporaries are removed, the background launcher is stopped); the command exits 128 + the signal (143 for
    SIGTERM), as a shell reports a tool the signal stopped. Python's default for SIGTERM is to die on the spot,
    which left the tiny verl launcher and its Ray cluster running."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal: 130 for Ctrl-C (SIGINT), 143 for SIGTERM."""
    return 128 + getattr(interrupt, "signum", 2)


@contextlib.contextmanager
def termination_raises():
    """SIGTERM and SIGHUP raise Terminated in the main thread for the block (elsewhere, where Python cannot take a
    handler, nothing changes); the previous handlers come back after it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
