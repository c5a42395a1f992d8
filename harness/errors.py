"""Errors that reach the user as one line (CLI exit code 2): bad input names the file or option and what to do."""


class BadInput(Exception):
    """Input the harness cannot use: a truncated log, a missing baseline, a wrong config, a missing package.

    The message is one line that names the file (with :line where it applies) or the option, and what to do.
    """
