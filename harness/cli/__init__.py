"""`ascend-rl-harness` command line: one module per subcommand in this package (asv's commands/ is the model),
each with `register(subparsers)`; they are imported when the parser is built, and import the heavy stack
(torch, verl, vLLM) only inside the command they run, so `--help` stays fast.

Exit codes: 0 pass, 1 a verdict failed, 2 bad input (one line naming the file or option: every HarnessError,
argparse complaint and full / read-only / denied file system is caught here, once), 130 SIGINT and 143 SIGTERM
(one line; the previous results kept), 141 stdout closed early (`plan ... | true` once crashed).
Each subcommand's --help adds a description, an example and its exit codes from harness/cli/help.py.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import textwrap

from harness import __version__
from harness.cli.args import Parser, UsageError
from harness.cli.help import HELP
from harness.config.host import apply_isa_mask
from harness.errors import BadInput, HarnessError, exit_code, termination_raises
from harness.io import WRITE_ERRNOS, write_error

PROG = "ascend-rl-harness"
# Subcommand modules in the order `--help` lists them; each adds its parser(s) with set_defaults(func=...).
COMMAND_MODULES = (
    "harness.cli.run_cmd",  # run: the main job (a scale's suites -> report)
    "harness.cli.plan_cmd",  # scales, plan
    "harness.cli.memory_cmd",  # memory
    "harness.cli.compare_cmd",  # compare, baseline record
    "harness.cli.throughput_cmd",  # throughput
    "harness.cli.report_cmd",  # report
    "harness.cli.launch_cmd",  # launch (Ray Jobs, --k8s manifest, --local loopback-only cluster)
    "harness.cli.doctor_cmd",  # doctor: this machine's stack against harness/config/stacks.py
    "harness.cli.lab_cmd",  # lab: one tiny DAPO lab run (also `python -m harness.lab`)
    "harness.cli.gate_cmd",  # gate: two stacks side by side, SAFE / CHANGED / BROKEN, bisection
)
CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool a closed pipe stopped


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="Test harness and benchmarks for DeepSeek-V3/R1 DAPO with verl on Ascend NPUs.",
        epilog="exit codes: 0 pass, 1 a verdict failed, 2 bad input, 130/143 interrupted (SIGINT/SIGTERM), "
               "141 stdout closed early.\n"
               "`ascend-rl-harness COMMAND --help` gives each command's description, an example and its exit codes.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    # Shell completion, generated from this parser by shtab (static scripts: a TAB never imports the harness, whose
    # commands pull torch and Ray; argcomplete would run the CLI on each TAB). Issue 33: there was none.
    #   bash: eval "$(ascend-rl-harness --print-completion bash)"
    #   zsh:  ascend-rl-harness --print-completion zsh > "${fpath[1]}/_ascend-rl-harness"
    try:
        import shtab
    except ImportError:  # a venv bootstrapped before shtab was pinned: every command still works, minus this option
        shtab = None
    if shtab is not None:
        shtab.add_argument_to(parser, "--print-completion", help="print the bash or zsh completion script and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    for path, child in subcommands(parser):
        doc = HELP.get(" ".join(path))
        if doc is not None:  # a command without an entry fails tests/test_cli_help.py, not the user
            child.description = textwrap.fill(doc.description, 78)  # 80-column CI logs
            child.epilog = doc.epilog()
            child.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(("baseline", "record"), parser), ...: every (nested) subcommand of `parser`, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from subcommands(child, (*path, name))


def main(argv: list[str] | None = None) -> int:
    with termination_raises():  # SIGTERM unwinds like Ctrl-C: every finally runs, nothing is left half-written
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        _check_working_directory()
        apply_isa_mask()  # HARNESS_CPU_ISA: before the command runs a kernel (harness.config.host)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not as "Exception ignored" at interpreter exit
        return code
    except UsageError as exc:
        print(f"{exc.prog}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"{_where(args)}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:  # a full, read-only or denied file system is bad input, not a crash
            raise
        error = write_error(exc.filename or "a file", exc)
        print(f"{_where(args)}: error: {_one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM / SIGHUP through termination_raises
        code = exit_code(exc)
        name = signal.Signals(code - 128).name if code - 128 in signal.Signals._value2member_map_ else "a signal"
        print(f"{_where(args)}: interrupted ({name}); the previous results are kept, nothing half-written",
              file=sys.stderr)
        return code
    except SystemExit as exc:
        # rich's Console.on_broken_pipe already pointed stdout at /dev/null and raises SystemExit(1), which CI
        # would read as a failed verdict
        if exc.code == 1 and _stdout_is_devnull():
            return CLOSED_PIPE
        raise


def _check_working_directory() -> None:
    """A deleted working directory (a shell left in a removed run directory) is bad input, said before anything
    resolves a relative path: `run` died with FileNotFoundError and `lab` with oneMKL's "Cannot load
    libtorch_cpu.so" (torch's loader resolves relative to it)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise BadInput("the working directory no longer exists (deleted while this shell was in it); cd to an "
                       "existing directory and run the command again") from None


def _where(args) -> str:
    return PROG if args is None else f"{PROG} {args.command}"


def _one_line(message: str) -> str:
    """The promised one line, whatever the input quoted in it holds (an argument `\r` or a file name with a
    newline split it): control characters are shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def _closed_pipe() -> int:
    """The reader of stdout went away (`| head`): stop quietly. Python's recipe (docs: signal, "Note on SIGPIPE"):
    point stdout at /dev/null, so the interpreter's final flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return CLOSED_PIPE


def _stdout_is_devnull() -> bool:
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(os.devnull))
    except (OSError, ValueError, AttributeError):  # a captured stdout (tests) has no file descriptor
        return False
