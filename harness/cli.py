"""`ascend-rl-harness` command line. Each subcommand lives beside the code it drives and registers
itself through `register(subparsers)`; modules are imported lazily so `--help` stays fast.

Exit codes: 0 pass, 1 a verdict failed, 2 bad input (one line naming the file or option).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from harness.errors import BadInput

# subcommand modules, each with register(subparsers) -> adds its parser(s) with set_defaults(func=...)
COMMAND_MODULES = (
    "harness.commands",  # scales, plan
    "harness.launch.cli",  # launch (Ray Jobs, --k8s manifest, --local loopback-only cluster)
    "harness.report.commands",  # throughput, report
    "harness.runner",  # run (the main job)
    "harness.memory.cli",  # memory
    "harness.metrics.cli",  # compare, baseline record
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ascend-rl-harness",
        description="Test harness and benchmarks for DeepSeek-V3/R1 DAPO with verl on Ascend NPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BadInput as exc:
        print(f"ascend-rl-harness {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
