"""`ascend-rl-harness lab`: one run of the tiny DAPO lab (a subcommand, its defaults
stated in --help). `python -m harness.lab` runs this same command; it is the Ray job entry point."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from harness.cli.args import SEED, real, whole
from harness.config.scales import SCALES
from harness.errors import BadInput
from harness.lab import FAULTS, LabConfig

# The lab's batch is bounded as the registered scales' batches are: at most the largest GBS and group any scale runs
# (full-a3's 512 x 16). --gbs/--n were bounded only at 2**31 (9.4 GB of RSS after 200 s for one step).
MAX_GBS = max(s.batch.gbs for s in SCALES.values())
MAX_N = max(s.batch.n for s in SCALES.values())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The lab's options with their defaults stated (LabConfig's)."""
    p.add_argument("--steps", type=whole(1), default=LabConfig.steps, help="DAPO steps (default %(default)s)")
    p.add_argument("--seed", type=SEED, default=LabConfig.seed,
                   help="seed of the policy init, the prompts and the rollout sampling (default %(default)s)")
    p.add_argument("--fault", default="none", choices=sorted(FAULTS),
                   help="rollout or trainer fault to inject (default %(default)s; see harness/lab/config.py)")
    add_recipe_arguments(p)
    p.add_argument("--engine", metavar="MODULE:FACTORY",
                   help="rollout engine factory (default: the reference engine); imports and runs MODULE, so "
                        "name only code you trust")
    p.add_argument("--out", required=True, help="run directory (metrics.jsonl + meta.json)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: `passed`, `state` FINISHED, the run directory and the last step's metrics")


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """The lab recipe's knobs (batch, group, updates per step, warm start). `lab` and scripts/calibrate-curves take
    the same ones, so a recipe is calibrated as it is run (issue 43: the calibration ran the default recipe only)."""
    p.add_argument("--gbs", type=whole(1, MAX_GBS), default=LabConfig.gbs,
                   help=f"prompts per step (default %(default)s, at most {MAX_GBS})")
    p.add_argument("--n", type=whole(2, MAX_N), default=LabConfig.n,
                   help=f"samples per prompt, a GRPO group (default %(default)s, at most {MAX_N})")
    p.add_argument("--mini-batch", type=whole(1, MAX_GBS), default=LabConfig.ppo_mini_batch_size, metavar="PROMPTS",
                   help="prompts per optimizer update (default %(default)s; verl's ppo_mini_batch_size): --gbs / "
                        "this many updates per step")
    p.add_argument("--init-seed", type=_init_seed, default=LabConfig.init_seed, metavar="SEED",
                   help="seed of the initial policy and its warm start (default %(default)s: one for every run, one "
                        "pretrained checkpoint, as real RL starts from; 'run': each run's --seed, with "
                        "--format-credit 0 the lab's recipe before 2026-12-08)")
    p.add_argument("--warm-start", type=whole(0, 10_000), default=LabConfig.warm_start, metavar="STEPS",
                   help="supervised steps on the task's format before RL (default %(default)s: RL from the random "
                        "init)")
    p.add_argument("--format-credit", type=real(0.0, 2.0), default=LabConfig.format_credit, metavar="CREDIT",
                   help="a graded reward: a wrong answer in the task's format scores -1 + this (default %(default)s;"
                        " 0: math_dapo's -1)")


def _init_seed(text: str) -> int | None:
    """--init-seed: a seed, or 'run' (None: each run draws its policy from its own --seed)."""
    if text.strip().lower() == "run":
        return None
    try:
        return SEED(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 'run'") from None


def recipe(args: argparse.Namespace) -> dict:
    """LabConfig's fields for add_recipe_arguments' options."""
    return {"gbs": args.gbs, "n": args.n, "ppo_mini_batch_size": args.mini_batch, "warm_start": args.warm_start,
            "init_seed": args.init_seed, "format_credit": args.format_credit}


def check_out(out: str) -> Path:
    """`--out`: a new or empty directory, or one without a run in it. A run's metrics.jsonl was truncated by a second
    `lab --out` onto it, and a file as --out was a NotADirectoryError traceback."""
    from harness.metrics.keys import META_FILE, METRICS_FILE

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out {out}: exists and is not a directory; pass a new run directory")
    held = [name for name in (METRICS_FILE, META_FILE) if (path / name).exists()]
    if held:
        raise BadInput(f"--out {out}: already holds a run ({', '.join(held)}); pass a new run directory")
    return path


def run(args: argparse.Namespace) -> int:
    """Run the lab as the options say; bad input raises BadInput (the caller prints it as one line, exit 2)."""
    check_out(args.out)
    config = LabConfig(steps=args.steps, seed=args.seed, fault=args.fault, **recipe(args))
    make_engine = None
    if args.engine:
        from harness.engines import load_factory

        if FAULTS[args.fault].engine_fault:
            raise BadInput(f"--fault {args.fault} is injected through the reference engine; drop --engine")
        make_engine = load_factory(args.engine)
    from rich.progress import Progress

    from harness.cli.output import console, emit, verdict
    from harness.io import WRITE_ERRNOS, write_error
    from harness.lab import run_lab

    last: dict = {}

    def progress(step: int, metrics: dict) -> None:
        last.update(step=step, metrics=metrics)
        bar.update(task, completed=step, description=f"step {step} reward {metrics['critic/rewards/mean']:+.2f} "
                                                     f"{metrics['perf/throughput']:.0f} TPS/device")

    with Progress(console=console(stderr=args.json)) as bar:  # --json: stdout carries only the JSON
        task = bar.add_task(f"DAPO lab seed {args.seed} fault {args.fault}", total=config.steps)
        try:
            # verl's FileLogger prints "Creating file logger at ..." on stdout: with --json that goes to stderr
            with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
                run_lab(config, args.out, make_engine=make_engine, progress=progress)
        except OSError as exc:  # verl's FileLogger writing into a full or read-only --out: the option, one line
            if exc.errno in WRITE_ERRNOS:
                raise write_error(args.out, exc) from None
            raise
    if args.json:  # a run that finished passed: the lab has no verdict of its own (compare judges its curves)
        return emit(verdict(True, "FINISHED", {"out": str(args.out), "steps": config.steps, "seed": args.seed,
                                               "fault": args.fault, "last_step": last.get("step"),
                                               "metrics": last.get("metrics", {})}))
    print(f"lab run written to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lab", help="one tiny DAPO lab run on CPU, a rollout fault injected on request")
    add_arguments(p)
    p.set_defaults(func=run)
