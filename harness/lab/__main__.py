"""`python -m harness.lab --steps N --seed S --fault F --out DIR`: one lab run (also the Ray job entry point).

Exit 0 when the run finished, 2 on bad input (one line on stderr)."""
from __future__ import annotations

import argparse
import sys

from harness.errors import BadInput
from harness.lab.loop import FAULTS, LabConfig, run_lab


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.lab", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=LabConfig.steps)
    p.add_argument("--seed", type=int, default=LabConfig.seed)
    p.add_argument("--fault", default="none", choices=sorted(FAULTS), help="rollout fault to inject")
    p.add_argument("--gbs", type=int, default=LabConfig.gbs, help="prompts per step")
    p.add_argument("--n", type=int, default=LabConfig.n, help="samples per prompt")
    p.add_argument("--engine", metavar="MODULE:FACTORY", help="rollout engine factory (default: the reference engine)")
    p.add_argument("--out", required=True, help="run directory (metrics.jsonl + meta.json)")
    args = p.parse_args(argv)
    try:
        config = LabConfig(steps=args.steps, seed=args.seed, fault=args.fault, gbs=args.gbs, n=args.n)
        make_engine = None
        if args.engine:
            from harness.engines import load_factory

            if FAULTS[args.fault].engine_fault:
                raise BadInput(f"--fault {args.fault} is injected through the reference engine; drop --engine")
            make_engine = load_factory(args.engine)
        from rich.progress import Progress

        with Progress() as bar:
            task = bar.add_task(f"DAPO lab seed {args.seed} fault {args.fault}", total=config.steps)
            run_lab(config, args.out, make_engine=make_engine, progress=lambda step, m: bar.update(
                task, completed=step, description=f"step {step} reward {m['critic/rewards/mean']:+.2f} "
                                                  f"{m['perf/throughput']:.0f} TPS/device"))
    except BadInput as exc:
        print(f"python -m harness.lab: error: {exc}", file=sys.stderr)
        return 2
    print(f"lab run written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
