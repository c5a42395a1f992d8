"""One verdict per output: every JSON a command prints (`--json`) leads with `passed` (bool) and `state` (the verdict
in words: ALIGNED, FITS, SUPPORTED, ...), and the command exits 0 exactly when `passed` is true, 1 when it is false
(2 and the signals print no JSON: one line on stderr). `throughput --json` printed `verdict: null` while exiting 1 on
a baseline regression, and `compare --json` carried `ok`, `aligned` and `state` that could disagree; one helper
for every command keeps them from drifting apart again (tests/test_cli_json.py runs each command)."""
from __future__ import annotations

from harness.numeric import json_text


def verdict(passed: bool, state: str, doc: dict | None = None) -> dict:
    """`doc` with `passed` and `state` first (a `passed` / `state` inside `doc` is replaced, never kept beside)."""
    return {"passed": bool(passed), "state": state,
            **{k: v for k, v in (doc or {}).items() if k not in ("passed", "state")}}


def emit(doc: dict) -> int:
    """Print a verdict document as JSON (never Infinity/NaN: harness.numeric) and return its exit code."""
    print(json_text(doc))
    return 0 if doc["passed"] else 1


NARROW = 120  # below this many columns a command prints one line per row instead of a table that folds every cell


def console(*, stderr: bool = False, **kwargs):
    """A rich Console for a command's output, as wide as what it writes to says: the terminal, or $COLUMNS when set
    (`scales` ignored COLUMNS=80 and printed 145 characters), else 160 columns for a log or a pipe (rich's 80
    there folded every cell); a log or a pipe without $COLUMNS gets its lines unfolded too."""
    import os
    import sys

    from rich.console import Console

    from harness.redact import for_terminal

    class Console(Console):  # noqa: PLW0621 -- rich's, with every text it renders made terminal-safe
        """Every string rendered (print arguments, table cells) through harness.redact.for_terminal: a run
        directory's name or a job's text with ESC sequences (`\x1b]0;...`, `\x1b[2J`) reached the terminal raw."""

        def render_str(self, text: str, **kw):
            return super().render_str(for_terminal(text), **kw)

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    wide = tty or os.environ.get("COLUMNS", "").strip().isdigit()
    kwargs.setdefault("soft_wrap", not wide)
    return Console(stderr=stderr, width=None if wide else 160, **kwargs)
