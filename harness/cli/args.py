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


def add_job_arguments(p: argparse.ArgumentParser, *, paths: bool = True) -> None:
    """The user's own job, the same on plan / memory / launch: `--recipe FILE`, `--model-path`, `--data-dir` and
    verl overrides after `--` (Hydra syntax, as `python3 -m verl.trainer.main_ppo` takes them)."""
    p.add_argument("--recipe", metavar="FILE", help="your verl job: a launch script (exports, variables and the "
                   "`python3 -m verl.trainer.main_ppo key=value ...` command; read, never run) or a Hydra YAML; its "
                   "settings win over the scale's")
    if paths:
        p.add_argument("--model-path", default=None, help="HF model directory written into the overrides "
                       "(default models/<model name>, or the recipe's actor_rollout_ref.model.path)")
        p.add_argument("--data-dir", default=None,
                       help="directory with train.parquet and test.parquet (default data/dapo, or the recipe's)")
    p.add_argument("overrides", nargs="*", metavar="-- OVERRIDE",
                   help="verl Hydra overrides after `--` (key=value, +key=value, ~key); they win over --recipe's")


def job_from_args(args: argparse.Namespace, scale: Scale | None = None):
    """The harness.config.job.Job of `--scale` (or `scale`) with --recipe, the overrides after `--`, --model-path
    and --data-dir."""
    from harness.config.job import build_job
    from harness.config.user_recipe import read_recipe

    scale = scale or scale_arg(args.scale)
    user = read_recipe(getattr(args, "recipe", None), getattr(args, "overrides", None) or ())
    return build_job(scale, user, model_path=getattr(args, "model_path", None),
                     data_dir=getattr(args, "data_dir", None))
