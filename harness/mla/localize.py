"""msprobe (mindstudio-probe) localisation: dump a forward of two engines at API level, `msprobe compare` the
step directories, and name the first op whose result is not `pass` (seed 001 localised the MindSpeed scale bug
by exactly this kind of op-by-op dump comparison between NPU and GPU).

msprobe's PrecisionDebugger is a process-wide singleton that wraps torch APIs, so dumps run in a fresh
interpreter: `python -m harness.mla.localize dump OUT [--fault F]`. `first_not_pass` is the checker; it only reads.
"""
from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput


def msprobe_command() -> str | None:
    """The `msprobe` console script of this interpreter's environment (a venv's bin/ is often not on PATH,
    e.g. under `make test`), else the one on PATH."""
    beside = Path(sys.executable).with_name("msprobe")
    return str(beside) if beside.is_file() else shutil.which("msprobe")


# One short prompt through the prefill path: every MLA op of every layer runs once.
PROMPT = (5, 9, 13, 2)


@dataclass(frozen=True)
class OpVerdict:
    """One row of an msprobe compare result: the op's tensor, its verdict, the worst difference, where it ran."""

    name: str
    result: str
    max_diff: str
    target: str  # target statistics (max/min/mean)
    golden: str
    stack: str

    def describe(self) -> str:
        return (f"first op not `pass`: {self.name} ({self.result}; max diff {self.max_diff}; target {self.target} vs "
                f"golden {self.golden}) at {self.stack}")


def dump_step(dump_dir: str | Path, *, fault: str | None = None, seed: int = 0, timeout: float = 300) -> Path:
    """Dump the reference engine's (optionally faulty) prefill forward with msprobe in a child process.
    Returns the step directory (`DUMP/step0`) for `msprobe compare`."""
    cmd = [sys.executable, "-m", "harness.mla.localize", "dump", str(dump_dir), "--seed", str(seed)]
    if fault:
        cmd += ["--fault", fault]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    step = Path(dump_dir) / "step0"
    if done.returncode != 0 or not step.is_dir():
        raise RuntimeError(f"msprobe dump into {dump_dir} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return step


def compare_steps(target_step: str | Path, golden_step: str | Path, out_dir: str | Path,
                  timeout: float = 300) -> Path:
    """`msprobe compare -tp TARGET/step0 -gp GOLDEN/step0 -o OUT`; returns the result CSV."""
    out_dir = Path(out_dir)
    command = msprobe_command()
    if command is None:
        raise BadInput("the `msprobe` command is missing: pip install mindstudio-probe (see requirements/cpu.txt)")
    done = subprocess.run([command, "compare", "-tp", str(target_step), "-gp", str(golden_step), "-o", str(out_dir)],
                          capture_output=True, text=True, timeout=timeout)
    results = sorted(out_dir.glob("compare_result_*.csv"))
    if done.returncode != 0 or not results:
        raise RuntimeError(f"msprobe compare failed (exit {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return results[-1]


def first_not_pass(result_csv: str | Path) -> OpVerdict | None:
    """The first row (execution order) of an msprobe compare CSV whose Result is not `pass`, or None."""
    path = Path(result_csv)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read msprobe compare result ({exc.strerror}); run `msprobe compare` "
                       "first") from None
    if not rows or "Result" not in rows[0]:
        raise BadInput(f"{path}: not an msprobe compare result (no `Result` column); point at compare_result_*.csv")
    stacks: dict[str, str] = {}  # msprobe puts an op's stack only on its first row (input.0)
    for row in rows:
        op = row["NPU Name"].split(".forward")[0].split(".backward")[0]
        if row.get("NPU_Stack_Info", "N/A") not in ("", "N/A"):
            stacks.setdefault(op, row["NPU_Stack_Info"])
        if row["Result"].strip().lower() != "pass":
            stack = stacks.get(op, "")
            # The innermost harness frame says which line computed the op.
            frame = next((part for part in stack.split("'File ") if "harness/" in part), stack[:200])
            return OpVerdict(name=row["NPU Name"], result=row["Result"], max_diff=row.get("Max diff", ""),
                             target=f"max {row.get('NPU max')} min {row.get('NPU min')} mean {row.get('NPU mean')}",
                             golden=f"max {row.get('Bench max')} min {row.get('Bench min')} "
                                    f"mean {row.get('Bench mean')}",
                             stack=" ".join(frame.replace("\\n", " ").split())[:300])
    return None


def _dump_main(args: argparse.Namespace) -> None:
    import torch
    from msprobe.pytorch import PrecisionDebugger, seed_all

    from harness.config.models import TINY
    from harness.engines.base import torch_threads
    from harness.engines.reference import ReferenceEngine
    from harness.engines.weights import random_state_dict

    seed_all(seed=1234, mode=True)
    engine = ReferenceEngine(TINY, random_state_dict(TINY, args.seed), fault=args.fault)
    debugger = PrecisionDebugger(task="statistics", dump_path=args.out, level="L1")
    debugger.start()
    with torch.no_grad(), torch_threads(1):
        engine.prefill_logits(list(PROMPT))
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m harness.mla.localize")
    sub = parser.add_subparsers(dest="cmd", required=True)
    dump = sub.add_parser("dump", help="msprobe statistics dump of the reference engine's prefill")
    dump.add_argument("out")
    dump.add_argument("--fault", default=None, help="a harness.engines.reference.EngineFault value")
    dump.add_argument("--seed", type=int, default=0)
    _dump_main(parser.parse_args())
