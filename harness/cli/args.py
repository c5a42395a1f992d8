"""Argument parsing shared by the subcommands: the parser class, whose errors are one line, and argument types
that turn a bad value into an error naming the option (issue 16: `--timeout nan`, `--steps 0` went through)."""
from __future__ import annotations

import argparse
import math

from harness.config.scales import Scale, get_scale
from harness.errors import BadInput, PlanError


class UsageError(BadInput):
    """argparse's complaint about the command line, with the (sub)command's prog to name it."""

    def __init__(self, message: str, prog: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse prints a usage block and raises SystemExit(2); here a bad option is one line, returned as exit 2 by
    `harness.cli.main` like every other bad input (a caller of main() gets the code, a CI log one line)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)", self.prog)


def _number(kind, text: str, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text} is not {what}")
    return value


def whole(minimum: int):
    """An argparse type: a whole number >= minimum."""
    def parse(text: str) -> int:
        return _number(int, text, f"a whole number >= {minimum}", lambda v: v >= minimum)
    return parse


def positive_float(text: str) -> float:
    return _number(float, text, "a positive finite number", lambda v: math.isfinite(v) and v > 0)


def scale_arg(name: str) -> Scale:
    """`--scale NAME` of every subcommand: the registered scale, its plan validated (the rule named)."""
    scale = get_scale(name)
    try:
        scale.validate()
    except PlanError as exc:
        raise PlanError(f"--scale {scale.name}: {exc}") from None
    return scale
