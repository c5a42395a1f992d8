"""`ascend-rl-harness` command line: one module per subcommand in this package (asv's commands/ is the model),
each with `register(subparsers)`; they are imported when the parser is built, and import the heavy stack
(torch, verl, vLLM) only inside the command they run, so `--help` stays fast.

Exit codes: 0 pass, 1 a verdict failed, 2 bad input (one line naming the file or option: every HarnessError
is caught here, once).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from harness import __version__
from harness.errors import HarnessError

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
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Test harness and benchmarks for DeepSeek-V3/R1 DAPO with verl on Ascend NPUs.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HarnessError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
