"""Argument parsing shared by the subcommands: the parser class, whose errors are one line, and argument types
that turn a bad value into an error naming the option, bounded by harness.numeric (`--timeout nan`, `--steps 0`,
`--workers -5` went through; `--devices 10**400`, `--seed -1`, `--workers 10**30` crashed)."""
from __future__ import annotations

import argparse
import math
import re

from harness import numeric
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
        # argparse says "argument --devices: 0: must be ..." for the types below: "--devices 0: must be ..."
        message = re.sub(r"^argument (\S+): (.*?): must be ", r"\1 \2: must be ", message)
        raise UsageError(f"{message} (see `{self.prog} --help`)", self.prog)


def _number(kind, text: str, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:  # also a 5000-digit integer (Python's int() limit)
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text[:40]}: must be {what}")
    return value


def whole(minimum: int, maximum: int = numeric.MAX_COUNT):
    """An argparse type: a whole number in [minimum, maximum] (harness.numeric: bounded before it reaches a range,
    an array size, xdist's worker count or a sleep)."""
    def parse(text: str) -> int:
        return _number(int, text, f"a whole number in [{minimum}, {maximum}]", lambda v: minimum <= v <= maximum)
    return parse


SEED = whole(0, numeric.MAX_SEED)  # --seed of the lab and the tiny launch: numpy and msprobe take 32-bit seeds


def real(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in [low, high] (an open end with low_open / high_open)."""
    def parse(text: str) -> float:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        return _number(float, text, f"a finite number in {bounds}",
                       lambda v: math.isfinite(v) and (v > low if low_open else v >= low)
                       and (v < high if high_open else v <= high))
    return parse


# --timeout, --stall-timeout: seconds a wait can take, within the numeric policy's durations (issue 48:
# `--stall-timeout 1e-300` was taken, a bound no step can meet)
positive_float = real(numeric.MIN_SECONDS, numeric.MAX_SECONDS)
fraction = real(0.0, 1.0, high_open=True)  # a relative tolerance: 0.05 = 5 %


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
    add_recipe_env_argument(p)
    if paths:
        p.add_argument("--model-path", default=None, help="HF model directory written into the overrides "
                       "(default models/<model name>, or the recipe's actor_rollout_ref.model.path)")
        p.add_argument("--data-dir", default=None,
                       help="directory with train.parquet and test.parquet (default data/dapo, or the recipe's)")
    p.add_argument("overrides", nargs="*", metavar="-- OVERRIDE",
                   help="verl Hydra overrides after `--` (key=value, +key=value, ~key); they win over --recipe's")


def add_recipe_env_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable of the environment the launch script is started with (repeatable), as in "
                        "`NAME=VALUE bash script.sh`; a script that stops on an unset ${NAME:?} needs it")


def recipe_from_args(args: argparse.Namespace):
    """The UserRecipe of --recipe (started with --recipe-env's variables) and the overrides after `--`."""
    from harness.config.user_recipe import parse_recipe_env, read_recipe

    env = parse_recipe_env(getattr(args, "recipe_env", None) or ())
    return read_recipe(getattr(args, "recipe", None), getattr(args, "overrides", None) or (), env)


def job_from_args(args: argparse.Namespace, scale: Scale | None = None):
    """The harness.config.job.Job of `--scale` (or `scale`) with --recipe, the overrides after `--`, --model-path
    and --data-dir."""
    from harness.config.job import build_job

    user = recipe_from_args(args)
    if scale is None and getattr(args, "scale", None) is None:  # `plan --recipe` alone: the recipe's own job
        from harness.config.job import scale_for_recipe

        scale = scale_for_recipe(user, getattr(args, "model_path", None))
    scale = scale or scale_arg(args.scale)
    return build_job(scale, user, model_path=getattr(args, "model_path", None),
                     data_dir=getattr(args, "data_dir", None))
