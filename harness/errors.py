"""The harness's errors: one root, `HarnessError`, whose message is one line the user reads (the CLI catches
the root once and exits 2). Bad input names the file (with :line where it applies) or the option, and what
to do; nothing else is printed, no traceback."""


class HarnessError(Exception):
    """Root of every error the harness raises on purpose; the message is one line naming what to fix."""


class BadInput(HarnessError):
    """Input the harness cannot use: a truncated log, a missing baseline, a wrong config, a missing package."""


class PlanError(BadInput):
    """An invalid parallel plan; the message names the violated rule and the numbers."""


class RecipeError(BadInput):
    """A DAPO recipe verl rejects: the message names the override key (or config section) and verl's reason."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class HardwareError(HarnessError):
    """A device stack that is present but unusable (e.g. torch_npu installed without CANN)."""
