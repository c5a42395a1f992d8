"""Argument types shared by the subcommands: each turns a bad value into a BadInput naming the option."""
from __future__ import annotations

from harness.config.scales import Scale, get_scale
from harness.errors import PlanError


def scale_arg(name: str) -> Scale:
    """`--scale NAME` of every subcommand: the registered scale, its plan validated (the rule named)."""
    scale = get_scale(name)
    try:
        scale.validate()
    except PlanError as exc:
        raise PlanError(f"--scale {scale.name}: {exc}") from None
    return scale
